"""The lookup's feature-major row order (docs/lookup.md#activation-row-order): the same
activations as TensorFlow's SparseCore-major order, rows permuted so that each feature's rows
are contiguous; bad sizes fail with InvalidArgumentError naming the table and the attribute."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.reference import lookup as ref  # noqa: E402
from tf_sc_embedding import ops  # noqa: E402

S, ROWS, DIM, SAMPLES_PER_SC = 4, 6, 3, 5


def _csr(seed):
    rng = np.random.default_rng(seed)
    segments = {}
    for sc in range(S):
        for shard in range(S):
            count = int(rng.integers(0, 6))
            entries = sorted((int(rng.integers(SAMPLES_PER_SC)), int(rng.integers(ROWS)),
                              float(rng.normal())) for _ in range(count))
            segments[(sc, 0, shard)] = sorted(entries, key=lambda e: e[1])
    return ref.pack_csr(segments, S, 1, S)


def _lookup(csr, table, **kwargs):
    rp, sa, to, ga = csr
    return ops.xla_sparse_dense_matmul_with_csr_input(
        rp, sa, to, ga, table, np.int32(1), input_size=S * SAMPLES_PER_SC,
        quantization_config_low=0.0, quantization_config_high=0.0,
        quantization_config_num_buckets=0, table_name="order_table",
        num_sparsecores_per_device=S, **kwargs).numpy()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("feature_rows", [(2, 3), (1, 0, 4), (5,)])
def test_feature_major_rows_are_a_permutation(seed, feature_rows):
    csr = _csr(seed)
    table = np.random.default_rng(seed + 100).normal(size=(S * ROWS, DIM)).astype(np.float32)
    sc_major = _lookup(csr, table)
    feature_major = _lookup(csr, table, feature_rows_per_sc=feature_rows)
    expected = []
    for f, rows in enumerate(feature_rows):
        start = sum(feature_rows[:f])
        for sc in range(S):
            expected.append(sc_major[sc * SAMPLES_PER_SC + start:
                                     sc * SAMPLES_PER_SC + start + rows])
    np.testing.assert_array_equal(feature_major, np.concatenate(expected))
    # A variable table (the resource kernel) gives the same rows.
    np.testing.assert_array_equal(
        _lookup(csr, tf.Variable(table), feature_rows_per_sc=feature_rows), feature_major)


@pytest.mark.parametrize("feature_rows, message", [
    ((2, 2), "must sum to the 5 samples per SparseCore"),
    ((6, -1), "sizes >= 0"),
    ((2**62, 2**62, 2**62), "overflow int64"),
])
def test_bad_feature_rows_are_invalid_arguments(feature_rows, message):
    table = np.zeros((S * ROWS, DIM), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"order_table.*{message}"):
        _lookup(_csr(0), table, feature_rows_per_sc=feature_rows)


# The fused update reads gradients in the same orders (docs/optimizers.md#gradient-order): the
# CSR's order, feature-major as one tensor, or one tensor per feature, with identical results.

def _update(csr, gradients, optimizer="adagrad", **kwargs):
    """[table, *slots] after one in-place update of a fixed table."""
    rng = np.random.default_rng(7)
    table = tf.Variable(rng.normal(size=(S * ROWS, DIM)).astype(np.float32))
    slots = {}
    if optimizer == "adagrad":
        slots["accumulator"] = tf.Variable(np.full((S * ROWS, DIM), 0.1, np.float32))
    function = (ops.xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input
                if optimizer == "adagrad" else ops.xla_sparse_dense_matmul_grad_with_sgd_and_csr_input)
    rp, sa, to, ga = csr
    function(rp, sa, to, ga, gradients, np.float32(0.1), table, **slots,
             num_minibatches_per_physical_sparse_core=np.int32(1), table_name="order_table",
             num_sparsecores_per_device=S, **kwargs)
    return [table.numpy()] + [v.numpy() for v in slots.values()]


def _feature_blocks(sc_major, feature_rows):
    """Each feature's gradient rows (SparseCore by SparseCore) cut out of the CSR's order."""
    blocks = []
    for f, rows in enumerate(feature_rows):
        start = sum(feature_rows[:f])
        blocks.append(np.concatenate([sc_major[sc * SAMPLES_PER_SC + start:
                                                sc * SAMPLES_PER_SC + start + rows]
                                      for sc in range(S)]))
    return blocks


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("feature_rows", [(2, 3), (1, 0, 4), (5,)])
def test_update_reads_feature_major_gradients(optimizer, seed, feature_rows):
    csr = _csr(seed)
    grads = np.random.default_rng(seed + 50).normal(size=(S * SAMPLES_PER_SC, DIM))
    grads = grads.astype(np.float32)
    expected = _update(csr, grads, optimizer)
    blocks = _feature_blocks(grads, feature_rows)
    for given in (np.concatenate(blocks), blocks):
        for got, want in zip(_update(csr, given, optimizer, feature_rows_per_sc=feature_rows),
                             expected):
            np.testing.assert_array_equal(got, want)
    # The order matters: the CSR's order read as feature-major is a different update (unless
    # the permutation is the identity).
    if len(feature_rows) > 1:
        moved = _update(csr, grads, optimizer, feature_rows_per_sc=feature_rows)
        assert any(not np.array_equal(a, b) for a, b in zip(moved, expected))


def test_non_finite_per_feature_gradients_fail_or_are_skipped_alike():
    csr = _csr(1)
    grads = np.ones((S * SAMPLES_PER_SC, DIM), np.float32)
    for sc in range(S):   # every gradient row of feature 1 (samples 2..4 of each SparseCore)
        grads[sc * SAMPLES_PER_SC + 2:(sc + 1) * SAMPLES_PER_SC, 0] = np.nan
    blocks = _feature_blocks(grads, (2, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="order_table.*non-finite"):
        _update(csr, blocks, "sgd", feature_rows_per_sc=(2, 3))
    rp, sa, to, ga = csr

    def skipped(gradients, **kwargs):
        table = tf.Variable(np.zeros((S * ROWS, DIM), np.float32))
        count = ops.xla_sparse_dense_matmul_grad_with_sgd_and_csr_input(
            rp, sa, to, ga, gradients, np.float32(0.1), table,
            num_minibatches_per_physical_sparse_core=np.int32(1), table_name="order_table",
            num_sparsecores_per_device=S, non_finite_gradients="skip",
            return_num_skipped_rows=True, **kwargs)
        return int(count), table.numpy()

    want = skipped(grads)
    assert want[0] > 0
    for given in (blocks, np.concatenate(blocks)):
        got = skipped(given, feature_rows_per_sc=(2, 3))
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])


def _misplaced(g):
    """Per-feature gradients of the right total size, one row moved from feature 1 to 0."""
    first, second = _feature_blocks(g, (2, 3))
    return [np.concatenate([first, second[:1]]), second[1:]]


@pytest.mark.parametrize("gradients, feature_rows, message", [
    (_misplaced, (2, 3), r"activation_gradients\[0\] has 9 rows, expected 4 source SparseCores x 2"),
    (lambda g: _feature_blocks(g, (2, 3)) + [g[:0]], (2, 3), "holds 3 tensors"),
    (lambda g: _feature_blocks(g, (2, 3)), (), "holds 2 tensors"),
    (lambda g: _feature_blocks(g, (3, 2))[::-1], (3, 2),
     r"activation_gradients\[0\] has 8 rows, expected 4 source SparseCores x 3"),
    (lambda g: [g[:, :2]], (), r"must be a matrix with the table's width 3"),
    (lambda g: [g], (2, 2), "must sum to the 5 samples per SparseCore"),
])
def test_bad_gradient_orders_are_invalid_arguments(gradients, feature_rows, message):
    grads = np.ones((S * SAMPLES_PER_SC, DIM), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"order_table.*{message}"):
        _update(_csr(0), gradients(grads), "sgd", feature_rows_per_sc=feature_rows)


def test_functional_update_keeps_tensorflows_signature():
    rp, sa, to, ga = _csr(0)
    grads = np.ones((S * SAMPLES_PER_SC, DIM), np.float32)
    with pytest.raises(ValueError, match="order_table.*in-place form"):
        ops.xla_sparse_dense_matmul_grad_with_sgd_and_csr_input(
            rp, sa, to, ga, _feature_blocks(grads, (2, 3)), np.float32(0.1),
            np.zeros((S * ROWS, DIM), np.float32),
            num_minibatches_per_physical_sparse_core=np.int32(1), table_name="order_table",
            num_sparsecores_per_device=S, feature_rows_per_sc=(2, 3))
