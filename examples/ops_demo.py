"""A short demo of the op library: learn embedding tables for a synthetic click model.

Each step preprocesses a batch of the built-in Criteo-like workload on the host (COO -> minibatch
splits -> CSR), looks the rows up, computes a logistic loss against labels drawn from a hidden
"teacher" table, and applies the fused Adagrad update in place. The loss should fall steadily.
Until the mid-level API and the main job land, this is what the README's first command runs.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from tf_sc_embedding import ops
from tf_sc_embedding.data import CriteoLikeWorkload

SPARSE_CORES = 4


def padded(vocabulary_size):
    return -(-vocabulary_size // (8 * SPARSE_CORES)) * (8 * SPARSE_CORES)


def storage_rows(ids, vocabulary_size):
    """Where raw ids live in the mod-sharded table (spec §2.5, one replica, no rotation)."""
    rows_per_shard = padded(vocabulary_size) // SPARSE_CORES
    return (ids % SPARSE_CORES) * rows_per_shard + ids // SPARSE_CORES


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=0.2)
    args = parser.parse_args()

    vocab = [max(3, v // 1000) for v in CriteoLikeWorkload().vocabulary_sizes]
    workload = CriteoLikeWorkload(vocabulary_sizes=vocab, seed=1)
    rng = np.random.default_rng(0)
    teacher = [rng.normal(0, 1.0, size=(v,)).astype(np.float32) for v in vocab]
    tables = [tf.Variable(tf.zeros([padded(v), args.dim])) for v in vocab]
    accumulators = [tf.Variable(tf.fill([padded(v), args.dim], 0.1)) for v in vocab]
    readout = tf.ones([args.dim]) / args.dim

    @tf.function
    def step(row_splits, ids, weights, labels):
        csrs = []
        for i, v in enumerate(vocab):
            coo = ops.convert_to_coo_tensor(row_splits[i], ids[i], weights[i], args.batch, "mean",
                                            vocabulary_size=v, table_name=f"t{i}",
                                            feature_name=f"f{i}")
            splits = ops.get_minibatch_splits_with_physical_replica(
                tf.constant([""]), coo.row_ids, coo.col_ids, coo.gains, args.batch, 1, padded(v),
                args.dim, SPARSE_CORES, f"t{i}", "", max_ids_per_partition=1 << 16,
                max_unique_ids_per_partition=1 << 16)
            csrs.append(ops.get_minibatches_in_csr_with_physical_replica(
                tf.constant([""]), splits.sorted_row_ids, splits.sorted_col_ids,
                splits.sorted_gains, splits.splits, splits.id_counts, args.batch, 1, 1, 8,
                padded(v), args.dim, SPARSE_CORES, f"t{i}", ""))
        with tf.GradientTape() as tape:
            activations = [ops.xla_sparse_dense_matmul_with_csr_input(
                c.row_pointers, c.sorted_sample_ids, c.sorted_token_ids, c.sorted_gains, t,
                c.num_minibatches_per_physical_sparse_core, args.batch, 0.0, 0.0, 0, f"t{i}")
                for i, (c, t) in enumerate(zip(csrs, tables))]
            tape.watch(activations)
            logits = tf.add_n([tf.linalg.matvec(a, readout) for a in activations])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, activations)
        for i, (c, g) in enumerate(zip(csrs, grads)):
            ops.xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input(
                c.row_pointers, c.sorted_sample_ids, c.sorted_token_ids, c.sorted_gains, g,
                tf.constant(args.learning_rate), tables[i], accumulators[i],
                c.num_minibatches_per_physical_sparse_core, f"t{i}")
        return loss

    start = time.time()
    for n in range(args.steps):
        batch = workload.batch(args.batch, index=n)
        teacher_logit = sum(np.add.reduceat(teacher[i][batch.ids[i]], batch.row_splits[i][:-1])
                            / np.diff(batch.row_splits[i]) for i in range(len(vocab)))
        labels = (rng.random(args.batch) < 1 / (1 + np.exp(-teacher_logit))).astype(np.float32)
        loss = step([tf.constant(s) for s in batch.row_splits], [tf.constant(i) for i in batch.ids],
                    [tf.ones_like(tf.constant(w)) for w in batch.weights], tf.constant(labels))
        if n % 20 == 0 or n == args.steps - 1:
            print(f"step {n:4d}  log loss {loss.numpy():.4f}")
    print(f"{args.steps} steps in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
