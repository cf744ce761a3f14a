"""A serving loop that keeps a live model fresh with the deltas the main job writes.

Start the main job with --delta-every N; it exports OUTPUT_DIR/serving_live after its first batch
and writes a delta every N batches into OUTPUT_DIR/deltas (docs/deltas.md). This loop loads the
live model with plain TensorFlow (the SavedModel uses stock ops only), then polls the folder:
each complete delta that follows the model's position is applied in place
(`model.embedding.apply_delta`), with the dense weights the job wrote beside it, and the model's
held-out AUC printed. It stops once the job has
marked the stream finished and every delta is applied, or after --timeout seconds.

    python -m tf_sc_embedding.examples.dlrm --steps 400 --delta-every 100 --output-dir out &
    python examples/serve_deltas.py --output-dir out

Give it the main job's data flags (--seed, --vocabulary-scale, --eval-samples) when they are not
the defaults: the held-out samples are the job's own.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_sc_embedding.data.teacher import TeacherLabelledData, auc  # noqa: E402
from tf_sc_embedding.deltas import delta_format  # noqa: E402
from tf_sc_embedding.examples import live_deltas  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default="out", help="the main job's --output-dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocabulary-scale", type=float, default=0.01)
    parser.add_argument("--eval-samples", type=int, default=65536)
    parser.add_argument("--poll-seconds", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="give up after this many seconds")
    return parser.parse_args(argv)


def held_out_inputs(args, names):
    """The serving signature's inputs and the labels of the job's held-out samples."""
    data = TeacherLabelledData(vocabulary_scale=args.vocabulary_scale, seed=args.seed)
    split = data.split(args.eval_samples, test=True)
    inputs = {"dense": tf.constant(split.dense, tf.float32)}
    for name, splits, ids in zip(data.feature_names, split.row_splits, split.ids):
        if name in names:
            inputs[f"{name}_ids"] = tf.constant(ids, tf.int64)
            inputs[f"{name}_row_splits"] = tf.constant(splits, tf.int64)
    return inputs, split.labels


def wait_for(path, deadline, poll):
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(poll)


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    deadline = time.time() + args.timeout
    model_dir = live_deltas.live_serving_dir(args.output_dir)
    stream = live_deltas.deltas_dir(args.output_dir)
    wait_for(os.path.join(model_dir, "saved_model.pb"), deadline, args.poll_seconds)
    time.sleep(1.0)   # the SavedModel's variables are written after its graph
    model = tf.saved_model.load(model_dir)
    serve = model.signatures["serving_default"]
    names = {k[:-len("_ids")] for k in serve.structured_input_signature[1] if k.endswith("_ids")}
    inputs, labels = held_out_inputs(args, names)

    def report(what):
        probability = serve(**inputs)["probability"].numpy()
        print(f"{what}: held-out AUC {auc(labels, probability):.4f}", flush=True)

    report(f"live model at {model.embedding.delta_position.numpy().decode()}")
    seen = set()
    while time.time() < deadline:
        finished = os.path.exists(os.path.join(stream, live_deltas.FINISHED))
        applied = apply_new_deltas(model, stream, seen)
        for sequence, run, ms in applied:
            report(f"delta {sequence} of run {run[:8]} applied in {ms:.0f} ms")
        if not applied and finished:
            count = sum(1 for _ in seen)
            print(f"the job finished; the live model is at "
                  f"{model.embedding.delta_position.numpy().decode()}", flush=True)
            return count
        if not applied:
            time.sleep(args.poll_seconds)
    raise TimeoutError(f"no end of the delta stream within {args.timeout} s")


def apply_new_deltas(model, stream, seen):
    """Applies, in order, the complete deltas under `stream` that follow the model's position,
    each with the dense weights written beside it; returns [(sequence, run, ms)]. `seen`: the
    paths already applied or skipped (another run's), updated."""
    applied = []
    for sequence, run, path in delta_format.list_deltas(stream):
        if path in seen:
            continue
        previous = delta_format.read_delta(path)[0].manifest["previous"]
        if previous != model.embedding.delta_position.numpy().decode():
            seen.add(path)   # another run's (an earlier job in the same folder)
            continue
        started = time.perf_counter()
        model.embedding.apply_delta(path)
        dense = os.path.join(stream, live_deltas.dense_file(sequence))
        if os.path.exists(dense):   # the job's dense weights at this delta
            with np.load(dense) as weights:
                for i, variable in enumerate(model.dense_variables):
                    variable.assign(weights[f"w{i}"])
        seen.add(path)
        applied.append((sequence, run, 1000 * (time.perf_counter() - started)))
    return applied


if __name__ == "__main__":
    main()
