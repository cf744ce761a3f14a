"""Keras main-job benchmark: training samples/second of the main job's DLRM (`model.fit`) with
tf_sc_embedding's EmbeddingLayer (fused per-table Adagrad, MLPs with Keras Adam), against the same
model whose tables are `keras.layers.Embedding` layers trained, with the MLPs, by one Keras
optimizer (Adagrad at the tables' learning rate, or Adam), in the same run, on the same data.
Throughput counts the batches after `--warmup` (tracing excluded); each model also reports its
held-out AUC after the run.

The EmbeddingLayer runs in three ways (`--variants`): "in_step" (ids into the layer, preprocessing
inside the training step), "tf_data" (the main job's default: `EmbeddingLayer.preprocess` in
`tf.data`, ahead of the step) and "pipelined" (tf_data + pipeline_execution_with_tensor_core).

Usage: python bench/bench_keras.py [--steps 300] [--batch-size 1024] [--embedding-dim 16]
       [--vocabulary-scale 0.01] [--threads 2] [--repeats 2]
"""
import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_sc_embedding.data.teacher import TeacherLabelledData  # noqa: E402
from tf_sc_embedding.examples import dlrm  # noqa: E402


# name -> (label, flags of the main job). The first one is the reference of the ratios.
VARIANTS = {
    "tf_data": ("tf_sc_embedding EmbeddingLayer, preprocessing in tf.data (main job default)",
                []),
    "in_step": ("tf_sc_embedding EmbeddingLayer, preprocessing in the step",
                ["--no-preprocess-in-data"]),
    "pipelined": ("tf_sc_embedding EmbeddingLayer, preprocessing in tf.data + pipelining",
                  ["--pipelining"]),
    "keras_adagrad": ("keras.layers.Embedding, Keras Adagrad (all weights)", None),
    "keras_adam": ("keras.layers.Embedding, Keras Adam (all weights)", None),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--vocabulary-scale", type=float, default=0.01)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2,
                        help="alternating runs of each model; the median is reported")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    return parser.parse_args()


def run(model, train, test, steps, batch_size, warmup):
    meter = dlrm._Throughput(batch_size, skip=warmup)  # pylint: disable=protected-access
    model.fit(train, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[meter])
    auc = model.evaluate(test, verbose=0, return_dict=True)["auc"]
    return meter.samples_per_second, float(auc)


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    data = TeacherLabelledData(vocabulary_scale=args.vocabulary_scale)
    train_split = data.split(args.steps * args.batch_size)
    test_split = data.split(32768, test=True)
    train = dlrm.make_dataset(train_split, args.batch_size, data.feature_names, repeat=True)
    test = dlrm.make_dataset(test_split, args.batch_size, data.feature_names)
    strategy = tf.distribute.get_strategy()
    common = ["--batch-size", str(args.batch_size), "--embedding-dim", str(args.embedding_dim),
              "--optimizer", "adagrad", "--learning-rate", str(args.learning_rate),
              "--vocabulary-scale", str(args.vocabulary_scale)]
    names = [n for n in args.variants.split(",") if n]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    results = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            flags = VARIANTS[name][1]
            job = dlrm.parse_args(common + (flags or []))
            model = dlrm.build_model(data, job, strategy, baseline=flags is None)
            model_train, model_test = train, test
            if flags is None:
                # Every weight (tables and MLPs) trained by one Keras optimizer: Adagrad at the
                # fused tables' learning rate, or Adam as the main job's MLPs use.
                optimizer = (keras.optimizers.Adagrad(learning_rate=args.learning_rate)
                             if name == "keras_adagrad" else keras.optimizers.Adam(0.001))
                model.compile(optimizer=optimizer, loss=model.loss, metrics=_metrics(),
                              jit_compile=False)
            elif job.preprocess_in_data:
                model_train = dlrm.preprocessed_dataset(train, model.sparse, args.batch_size,
                                                        strategy)
                model_test = dlrm.preprocessed_dataset(test, model.sparse, args.batch_size,
                                                       strategy)
            results[name].append(run(model, model_train, model_test, args.steps,
                                     args.batch_size, args.warmup))
            print(f"{name}: {results[name][-1][0]:,.0f} samples/s, AUC {results[name][-1][1]:.4f}",
                  flush=True)
            del model
    rows = {name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            for name, runs in results.items()}
    reference = rows[names[0]][0]
    tables = sum(data.vocabulary_sizes)
    print(f"\n### Keras main job: DLRM `model.fit`, batch {args.batch_size}, dim "
          f"{args.embedding_dim}, 26 tables / {tables:,} rows, {args.steps} steps, "
          f"{args.threads} threads, median of {args.repeats}\n")
    print(f"| tables | samples/s | vs. {names[0]} | held-out AUC |")
    print("|---|---:|---:|---:|")
    for name, (sps, auc) in rows.items():
        print(f"| {VARIANTS[name][0]} | {sps:,.0f} | {sps / reference:.2f}x | {auc:.4f} |")
    if "pipelined" in rows and "tf_data" in rows:
        print(f"\nheld-out AUC, pipelined - sequential: "
              f"{rows['pipelined'][1] - rows['tf_data'][1]:+.4f}")


def _metrics():
    return [keras.metrics.AUC(from_logits=True, num_thresholds=1000, name="auc"),
            keras.metrics.BinaryCrossentropy(from_logits=True, name="log_loss")]


if __name__ == "__main__":
    main()
