"""Delta exports (docs/deltas.md): their size against the full tables, and the time to write one.

1. Size. The Criteo-like workload (26 tables with the Criteo cardinalities capped at --cap rows,
   dim --dim, Adagrad, batch --batch, 1 replica, every step a new batch) trains with
   delta_tracking=True; a delta is
   exported after 10 steps, then after 100 more and 1000 more (each delta holds the rows trained
   since the previous one), both serving-only and with the optimizer state (two embeddings
   trained on the same batches). Reported per delta: the rows sent, the bytes on disk, the bytes
   of those rows (values, plus slots with optimizer state), their ratio (the format's overhead:
   ids, keys, headers, manifest) and the share of the full tables' bytes.
2. Write time. One table of 4,000,000 rows of dim --dim takes one step of --write-rows distinct
   ids; the delta of those rows is then exported --repeats times (the flags re-marked by one step
   between), and the median time of export_delta (reading the rows, writing and fsyncing the
   files) is reported, with and without optimizer state.

Usage: python bench/bench_deltas.py [--cap 4000000] [--dim 16] [--batch 4096]
       [--steps 10,100,1000] [--write-rows 100000] [--repeats 5]
"""
import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_sc_embedding as sce  # noqa: E402
from bench_api import capped_vocabulary, dense_head, training_step  # noqa: E402
from common import ragged_features  # noqa: E402
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402
from tf_sc_embedding.deltas import delta_format  # noqa: E402

E = tf.tpu.experimental.embedding


def make_embedding(vocab, dim, batch):
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner="sum",
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    embedding = sce.TPUEmbeddingV2(features, E.Adagrad(learning_rate=0.05), delta_tracking=True)
    embedding.build(per_replica_batch_size=batch)
    return embedding


def train_step(embedding, num_features, dim):
    return training_step(embedding, [f"f{i}" for i in range(num_features)],
                         dense_head(num_features, dim))


def delta_bytes(path):
    """(bytes on disk, rows sent, bytes of the rows and slots sent) of a delta."""
    total = sum(os.path.getsize(os.path.join(folder, f))
                for folder, _, files in os.walk(path) for f in files)
    rows = payload = 0
    for part in delta_format.read_delta(path):
        for name, table in part.manifest["tables"].items():
            rows += table["count"]
            width = table["dim"] * (2 if table["dtype"] != "float32" else 4)
            slots = sum(table["slots"].values()) * 4 if part.manifest["optimizer_state"] else 0
            payload += table["count"] * (width + slots)
    return total, rows, payload


def fresh_batches(vocab, batch, seed=0):
    """An endless iterator of distinct workload batches (batch i of the seeded workload), made
    as they are consumed: a repeating pool would stop touching new rows after one cycle."""
    workload = CriteoLikeWorkload(vocabulary_sizes=vocab, seed=seed)

    def generate():
        rng = np.random.default_rng(seed + 1)
        for index in itertools.count():
            ids, weights = ragged_features(workload.batch(batch, index=index))
            yield ids, weights, (rng.random(batch) < 0.3).astype(np.float32)

    ragged = {f"f{i}": tf.RaggedTensorSpec([batch, None], tf.int32, 1, tf.int32)
              for i in range(len(vocab))}
    weights = {name: tf.RaggedTensorSpec([batch, None], tf.float32, 1, tf.int32)
               for name in ragged}
    return iter(tf.data.Dataset.from_generator(generate, output_signature=(
        ragged, weights, tf.TensorSpec([batch], tf.float32))).prefetch(2))


def sizes(args, directory):
    vocab = capped_vocabulary(args.cap)
    serving, recovery = (make_embedding(vocab, args.dim, args.batch) for _ in range(2))
    steps = {e: train_step(e, len(vocab), args.dim) for e in (serving, recovery)}
    iterators = {e: fresh_batches(vocab, args.batch) for e in (serving, recovery)}
    full = sum(vocab) * args.dim * 4
    print(f"\n### Delta size, Criteo-like tables capped at {args.cap:,} rows ({sum(vocab):,} rows, "
          f"dim {args.dim}: {full / 2**20:,.0f} MiB of rows, as much again of Adagrad "
          f"slots), batch {args.batch}\n")
    print("| steps since the previous delta | rows sent | share of all rows | delta MiB | "
          "/ rows' bytes | / full tables | with optimizer state MiB | / rows' and slots' bytes "
          "| / full tables and slots |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for count in [int(s) for s in args.steps.split(",")]:
        for embedding in (serving, recovery):
            for _ in range(count):
                steps[embedding](iterators[embedding])
        a = delta_bytes(serving.export_delta(os.path.join(directory, "serving")))
        b = delta_bytes(recovery.export_delta(os.path.join(directory, "recovery"),
                                              include_optimizer_state=True))
        print(f"| {count} | {a[1]:,} | {a[1] / sum(vocab):.2%} | {a[0] / 2**20:.1f} | "
              f"{a[0] / a[2]:.3f}x | {a[0] / full:.2%} | {b[0] / 2**20:.1f} | "
              f"{b[0] / b[2]:.3f}x | {b[0] / (2 * full):.2%} |", flush=True)


def write_time(args, directory):
    rows = 4_000_000
    embedding = make_embedding([rows], args.dim, args.write_rows)
    step = train_step(embedding, 1, args.dim)
    rng = np.random.default_rng(0)
    print(f"\n### Writing a delta of {args.write_rows:,} rows (one table of {rows:,} rows, dim "
          f"{args.dim}), median of {args.repeats}\n")
    print("| delta | rows | ms | MB/s |\n|---|---:|---:|---:|")
    for with_state in (False, True):
        times, sent, size = [], 0, 0
        for _ in range(args.repeats):
            ids = rng.choice(rows, args.write_rows, replace=False).astype(np.int64)
            batch = (tf.RaggedTensor.from_row_lengths(ids, np.ones(len(ids), np.int64)),
                     tf.RaggedTensor.from_row_lengths(np.ones(len(ids), np.float32),
                                                      np.ones(len(ids), np.int64)),
                     np.zeros(len(ids), np.float32))
            step(iter([({"f0": batch[0]}, {"f0": batch[1]}, batch[2])]))
            started = time.perf_counter()
            path = embedding.export_delta(directory, include_optimizer_state=with_state)
            times.append(time.perf_counter() - started)
            size, sent, _ = delta_bytes(path)
        ms = statistics.median(times) * 1e3
        label = "with optimizer state" if with_state else "serving (rows only)"
        print(f"| {label} | {sent:,} | {ms:.0f} | {size / 2**20 / (ms / 1e3):.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", default="10,100,1000")
    parser.add_argument("--write-rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-sizes", action="store_true")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    directory = tempfile.mkdtemp(prefix="bench_deltas_")
    try:
        if not args.skip_sizes:
            sizes(args, directory)
        write_time(args, os.path.join(directory, "write"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
