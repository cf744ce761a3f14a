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
