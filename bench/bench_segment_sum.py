"""`SceGatheredSegmentSum` against TensorFlow's gather + multiply + `unsorted_segment_sum`, in both
directions of the all-to-all exchange (docs/multi_worker.md#combining-rows-one-op-in-both-directions).

Inputs of one replica's step, drawn once: --entries ids in sample order over --samples output
rows, each referring to one of --unique rows (skewed: row = unique * u^2, u uniform, so some rows
have many ids), width --dim, gains 1.

  rows to activations     rows [unique, dim], positions = each id's unique row (unordered),
                          segments = each id's sample (sorted)
  gradients to unique     rows [samples, dim], positions = each id's sample (sorted),
                          segments = each id's unique row (unordered)

Each is a `tf.function`; every round calls all four once in turn. Reported: median wall and CPU
(process, all threads) ms per call, and TensorFlow / ours.

Usage: python bench/bench_segment_sum.py [--threads 2] [--calls 300] [--entries 80000]
       [--unique 40000] [--samples 26624] [--dim 32]
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_sc_embedding.ops.segment_sum import gathered_segment_sum  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--entries", type=int, default=80_000)
    parser.add_argument("--unique", type=int, default=40_000)
    parser.add_argument("--samples", type=int, default=26 * 1024)
    parser.add_argument("--dim", type=int, default=32)
    return parser.parse_args()


def tensorflow_sum(rows, positions, gains, segments, num_segments):
    """What a TensorFlow user writes: three ops and an [entries, dim] intermediate."""
    return tf.math.unsorted_segment_sum(tf.gather(rows, positions) * gains[:, None], segments,
                                        num_segments)


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    rng = np.random.default_rng(1)
    unique = np.minimum(args.unique - 1,
                        (args.unique * rng.random(args.entries) ** 2).astype(np.int32))
    samples = (np.arange(args.entries) * args.samples // args.entries).astype(np.int32)
    gains = tf.ones([args.entries])
    rows = tf.constant(rng.random((args.unique, args.dim), dtype=np.float32))
    grads = tf.constant(rng.random((args.samples, args.dim), dtype=np.float32))
    unique, samples = tf.constant(unique), tf.constant(samples)
    cases = {
        ("rows to activations", "ours"): tf.function(
            lambda: gathered_segment_sum(rows, unique, gains, samples, args.samples)),
        ("rows to activations", "tensorflow"): tf.function(
            lambda: tensorflow_sum(rows, unique, gains, samples, args.samples)),
        ("gradients to unique", "ours"): tf.function(
            lambda: gathered_segment_sum(grads, samples, gains, unique, args.unique)),
        ("gradients to unique", "tensorflow"): tf.function(
            lambda: tensorflow_sum(grads, samples, gains, unique, args.unique)),
    }
    for direction in ("rows to activations", "gradients to unique"):
        ours = cases[(direction, "ours")]().numpy()
        theirs = cases[(direction, "tensorflow")]().numpy()
        np.testing.assert_array_equal(ours, theirs)   # bit-identical (docs)
    wall = {key: [] for key in cases}
    cpu = {key: [] for key in cases}
    for _ in range(args.calls):
        for key, fn in cases.items():
            w, c = time.perf_counter(), time.process_time()
            fn().numpy()
            wall[key].append((time.perf_counter() - w) * 1e3)
            cpu[key].append((time.process_time() - c) * 1e3)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(f"\n{args.entries:,} entries, {args.unique:,} unique rows, {args.samples:,} samples, "
          f"dim {args.dim}, {args.threads} threads, median of {args.calls} calls\n")
    print("| direction | ours wall ms | CPU ms | TensorFlow wall ms | CPU ms | TF / ours (wall) |")
    print("|---|---:|---:|---:|---:|---:|")
    for direction in ("rows to activations", "gradients to unique"):
        o, t = (direction, "ours"), (direction, "tensorflow")
        mo, mt = statistics.median(wall[o]), statistics.median(wall[t])
        print(f"| {direction} | {mo:.2f} | {statistics.median(cpu[o]):.2f} | {mt:.2f} | "
              f"{statistics.median(cpu[t]):.2f} | {mt / mo:.1f}x |")


if __name__ == "__main__":
    main()
