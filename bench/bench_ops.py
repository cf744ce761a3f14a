"""Op-library benchmark: preprocessing, forward and forward + fused Adagrad on the Criteo-like
workload (26 tables, 18.8M rows, dim 32, batch 4096), against what a TensorFlow user runs today:
`tf.nn.embedding_lookup_sparse` and a sparse Adagrad apply (TF1 `AdagradOptimizer` and Keras).

Usage: python bench/bench_ops.py [--batch 4096] [--dim 32] [--threads 2] [--iterations 20]
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import report, time_per_call  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402

SPARSE_CORES = 4
LEARNING_RATE = 0.05


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--vocabulary-scale", type=float, default=1.0,
                        help="multiply every vocabulary size (for quick runs)")
    parser.add_argument("--skip-keras", action="store_true", help="skip the (slow) Keras Adagrad")
    return parser.parse_args()


def padded_rows(vocabulary_size):
    multiple = 8 * SPARSE_CORES
    return -(-vocabulary_size // multiple) * multiple


def initial_table(rows, dim, seed):
    return tf.random.stateless_uniform([rows, dim], seed=[seed, 0], minval=-0.05, maxval=0.05)


class OurPipeline:
    """COO -> minibatch splits -> CSR -> lookup -> fused Adagrad, one table per feature."""

    def __init__(self, vocabulary_sizes, dim, batch, combiner="mean",
                 max_ids_per_chip_per_sample=8, max_minibatches_per_sc=1):
        self.vocabulary_sizes = vocabulary_sizes
        self.batch = batch
        self.combiner = combiner
        self.max_ids_per_chip_per_sample = max_ids_per_chip_per_sample
        self.max_minibatches_per_sc = max_minibatches_per_sc
        self.tables = [tf.Variable(initial_table(padded_rows(v), dim, i), name=f"table_{i}")
                       for i, v in enumerate(vocabulary_sizes)]
        self.accumulators = [tf.Variable(tf.fill(t.shape, 0.1)) for t in self.tables]

    @tf.function
    def preprocess(self, row_splits, ids, weights):
        results = []
        for i, vocab in enumerate(self.vocabulary_sizes):
            name = f"table_{i}"
            coo = ops.convert_to_coo_tensor(row_splits[i], ids[i], weights[i], self.batch,
                                            self.combiner,
                                            vocabulary_size=vocab, table_name=name,
                                            feature_name=f"feature_{i}")
            splits = ops.get_minibatch_splits_with_physical_replica(
                tf.constant([""]), coo.row_ids, coo.col_ids, coo.gains, sample_count=self.batch,
                num_replica=1, table_vocab_size=padded_rows(vocab), feature_width=1,
                num_sc_per_chip=SPARSE_CORES, table_name=name, mini_batch_splits="",
                max_ids_per_partition=1 << 20, max_unique_ids_per_partition=1 << 20)
            csr = ops.get_minibatches_in_csr_with_physical_replica(
                tf.constant([""]), splits.sorted_row_ids, splits.sorted_col_ids,
                splits.sorted_gains, splits.splits, splits.id_counts, sample_count=self.batch,
                num_replica=1, max_minibatches_per_sc=self.max_minibatches_per_sc,
                max_ids_per_chip_per_sample=self.max_ids_per_chip_per_sample,
                table_vocab_size=padded_rows(vocab), feature_width=1,
                num_sc_per_chip=SPARSE_CORES, table_name=name, mini_batch_in_csr="",
                trim_to_size=True)
            results.append((csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids,
                            csr.sorted_gains, csr.num_minibatches_per_physical_sparse_core))
        return results

    def _lookup(self, i, csr):
        return ops.xla_sparse_dense_matmul_with_csr_input(
            *csr[:4], self.tables[i], csr[4], input_size=self.batch, quantization_config_low=0.0,
            quantization_config_high=0.0, quantization_config_num_buckets=0,
            table_name=f"table_{i}")

    @tf.function
    def forward(self, csrs):
        return [self._lookup(i, csr) for i, csr in enumerate(csrs)]

    @tf.function
    def forward_and_update(self, csrs, upstream):
        activations = [self._lookup(i, csr) for i, csr in enumerate(csrs)]
        # Gradient of sum(activation * upstream) with respect to each activation is `upstream`;
        # the control dependency keeps the forward read before the in-place update.
        with tf.control_dependencies(activations):
            for i, csr in enumerate(csrs):
                ops.xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input(
                    *csr[:4], upstream[i], tf.constant(LEARNING_RATE), self.tables[i],
                    self.accumulators[i], csr[4], table_name=f"table_{i}")
        return activations


class TensorFlowBaseline:
    """What a TensorFlow user writes today: embedding_lookup_sparse + an optimizer."""

    def __init__(self, vocabulary_sizes, dim, optimizer):
        self.tables = [tf.Variable(initial_table(v, dim, i)) for i, v in enumerate(vocabulary_sizes)]
        self.optimizer = optimizer

    def _lookup(self, sparse_ids, sparse_weights):
        return [tf.nn.embedding_lookup_sparse(t, i, w, combiner="mean")
                for t, i, w in zip(self.tables, sparse_ids, sparse_weights)]

    @tf.function
    def forward(self, sparse_ids, sparse_weights):
        return self._lookup(sparse_ids, sparse_weights)

    @tf.function
    def forward_and_update(self, sparse_ids, sparse_weights, upstream):
        with tf.GradientTape() as tape:
            activations = self._lookup(sparse_ids, sparse_weights)
            loss = tf.add_n([tf.reduce_sum(a * u) for a, u in zip(activations, upstream)])
        grads = tape.gradient(loss, self.tables)
        self.optimizer.apply_gradients(zip(grads, self.tables))
        return activations


def to_sparse(batch):
    ids, weights = [], []
    for splits, feature_ids, feature_weights in zip(batch.row_splits, batch.ids, batch.weights):
        ragged_ids = tf.RaggedTensor.from_row_splits(feature_ids.astype(np.int64), splits)
        ragged_weights = tf.RaggedTensor.from_row_splits(feature_weights, splits)
        ids.append(ragged_ids.to_sparse())
        weights.append(ragged_weights.to_sparse())
    return ids, weights


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    workload = CriteoLikeWorkload()
    vocab = [max(3, int(v * args.vocabulary_scale)) for v in workload.vocabulary_sizes]
    if args.vocabulary_scale != 1.0:
        workload = CriteoLikeWorkload(vocabulary_sizes=vocab)
    batch = workload.batch(args.batch)
    row_splits = [tf.constant(s) for s in batch.row_splits]
    ids = [tf.constant(i) for i in batch.ids]
    weights = [tf.constant(w) for w in batch.weights]
    upstream = [tf.random.stateless_normal([args.batch, args.dim], seed=[7, i])
                for i in range(len(vocab))]
    print(f"workload: {len(vocab)} tables, {sum(vocab):,} rows, dim {args.dim}, batch {args.batch}, "
          f"{sum(len(i) for i in batch.ids):,} ids per batch, {args.threads} threads")

    ours = OurPipeline(vocab, args.dim, args.batch)
    csrs = ours.preprocess(row_splits, ids, weights)
    # A tf.function call returns when its ops have run (CPU execution is synchronous), so the
    # timings include no copy of the outputs to numpy, for us and for the baselines alike.
    t_pre = time_per_call(lambda: ours.preprocess(row_splits, ids, weights), args.iterations)
    t_fwd = time_per_call(lambda: ours.forward(csrs), args.iterations)
    t_upd = time_per_call(lambda: ours.forward_and_update(csrs, upstream), args.iterations)
    del ours

    sparse_ids, sparse_weights = to_sparse(batch)
    v1 = TensorFlowBaseline(vocab, args.dim, tf.compat.v1.train.AdagradOptimizer(
        LEARNING_RATE, initial_accumulator_value=0.1))
    b_fwd = time_per_call(lambda: v1.forward(sparse_ids, sparse_weights), args.iterations)
    b_v1 = time_per_call(lambda: v1.forward_and_update(sparse_ids, sparse_weights, upstream),
                         args.iterations)
    del v1
    rows = [
        ("tf_sc_embedding preprocessing (COO -> splits -> CSR, all tables)", t_pre, None),
        ("tf_sc_embedding forward", t_fwd, None),
        ("tf_sc_embedding forward + fused Adagrad", t_upd, None),
        ("TF embedding_lookup_sparse forward", b_fwd, b_fwd / t_fwd),
        ("TF lookup + tf.compat.v1 AdagradOptimizer (sparse apply)", b_v1, b_v1 / t_upd),
    ]
    if not args.skip_keras:
        import keras  # noqa: PLC0415
        keras_model = TensorFlowBaseline(vocab, args.dim, keras.optimizers.Adagrad(
            LEARNING_RATE, initial_accumulator_value=0.1))
        b_keras = time_per_call(
            lambda: keras_model.forward_and_update(sparse_ids, sparse_weights, upstream),
            max(3, args.iterations // 4), warmup=1)
        rows.append(("TF lookup + Keras Adagrad", b_keras, b_keras / t_upd))
    report(rows, "Per-batch times (median)")


if __name__ == "__main__":
    main()
