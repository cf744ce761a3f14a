"""Mid-level API benchmark: a full training step through `TPUEmbeddingV2` (enqueue + lookup +
a small dense loss + fused Adagrad) on the Criteo-like workload, against a TensorFlow user's step
(`tf.nn.embedding_lookup_sparse` + `tf.compat.v1.train.AdagradOptimizer`), in the same run; then
the step time as the largest table grows from 10^4 to 10^7 rows at a fixed batch.

Usage: python bench/bench_api.py [--batch 4096] [--dim 32] [--threads 2] [--iterations 10]
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import time_per_call  # noqa: E402

import tf_sc_embedding as sce  # noqa: E402
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402

LEARNING_RATE = 0.05
E = tf.tpu.experimental.embedding


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--scaling-sizes", default="10000,100000,1000000,10000000")
    parser.add_argument("--skip-comparison", action="store_true")
    return parser.parse_args()


def ragged_features(batch):
    ids = {f"f{i}": tf.RaggedTensor.from_row_splits(i_, s) for i, (i_, s) in
           enumerate(zip(batch.ids, batch.row_splits))}
    weights = {f"f{i}": tf.RaggedTensor.from_row_splits(w, s) for i, (w, s) in
               enumerate(zip(batch.weights, batch.row_splits))}
    return ids, weights


def dense_head(num_features, dim):
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(0, 0.1, size=(num_features * dim, 1)).astype(np.float32))


def our_step_fn(vocab, dim, batch):
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner="mean",
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    embedding = sce.TPUEmbeddingV2(features, E.Adagrad(learning_rate=LEARNING_RATE))
    embedding.build(per_replica_batch_size=batch)
    head = dense_head(len(vocab), dim)

    @tf.function
    def step(ids, weights, labels):
        activations, preserved = embedding.embedding_lookup(ids, weights)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            logits = tf.matmul(tf.concat([activations[f"f{i}"] for i in range(len(vocab))], 1),
                               head)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        embedding.apply_gradients(tape.gradient(loss, activations), preserved)
        return loss
    return step


def tensorflow_step_fn(vocab, dim):
    tables = [tf.Variable(tf.random.uniform([v, dim], -0.05, 0.05, seed=i)) for i, v in
              enumerate(vocab)]
    optimizer = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE, initial_accumulator_value=0.1)
    head = dense_head(len(vocab), dim)

    @tf.function
    def step(sparse_ids, sparse_weights, labels):
        with tf.GradientTape() as tape:
            activations = [tf.nn.embedding_lookup_sparse(t, i, w, combiner="mean")
                           for t, i, w in zip(tables, sparse_ids, sparse_weights)]
            logits = tf.matmul(tf.concat(activations, 1), head)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    labels = tf.constant((np.random.default_rng(1).random(args.batch) < 0.3).astype(np.float32))

    print("\n### Full training step, Criteo-like workload (26 tables, 18.8M rows)\n")
    workload = CriteoLikeWorkload()
    vocab = list(workload.vocabulary_sizes)
    ids, weights = ragged_features(workload.batch(args.batch))
    ours = our_step_fn(vocab, args.dim, args.batch)
    t_ours = time_per_call(lambda: ours(ids, weights, labels).numpy(), args.iterations)
    del ours
    print("| step | ms per batch | vs. tf_sc_embedding |\n|---|---:|---:|")
    print(f"| tf_sc_embedding TPUEmbeddingV2 (enqueue + lookup + loss + fused Adagrad) | "
          f"{t_ours:.1f} | |")
    if not args.skip_comparison:
        sparse_ids = [ids[f"f{i}"].to_sparse() for i in range(len(vocab))]
        sparse_weights = [weights[f"f{i}"].to_sparse() for i in range(len(vocab))]
        theirs = tensorflow_step_fn(vocab, args.dim)
        t_tf = time_per_call(lambda: theirs(sparse_ids, sparse_weights, labels).numpy(),
                             args.iterations)
        del theirs
        print(f"| TF embedding_lookup_sparse + tf.compat.v1 AdagradOptimizer | {t_tf:.1f} | "
              f"{t_tf / t_ours:.1f}x |")

    print("\n### Step time as the largest table grows (25 tables capped at 10^4 rows, batch "
          f"{args.batch})\n")
    print("| largest table rows | ms per step | vs. smallest |\n|---|---:|---:|")
    first = None
    for size in (int(s) for s in args.scaling_sizes.split(",")):
        vocab = [min(v, 10_000) for v in CriteoLikeWorkload.__init__.__defaults__[0]]
        vocab[2] = size
        workload = CriteoLikeWorkload(vocabulary_sizes=vocab)
        ids, weights = ragged_features(workload.batch(args.batch))
        step = our_step_fn(vocab, args.dim, args.batch)
        t = time_per_call(lambda: step(ids, weights, labels).numpy(), args.iterations)
        first = first or t
        print(f"| {size:,} | {t:.1f} | {t / first:.2f}x |")
        del step


if __name__ == "__main__":
    main()
