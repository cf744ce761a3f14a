"""The grouped forward lookup (docs/lookup.md#grouping-at-enqueue): `group_lookup_entries` equals
the numpy reference's grouping, and `sparse_dense_matmul_grouped` over it gives the CSR lookup's
activations bit for bit (float32, bfloat16 and float16 rows, tensor and variable tables, both row
orders); malformed groupings and CSRs fail with InvalidArgumentError naming the table, and a
failed call leaves the next one unaffected."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from tests.ops.test_property_lookup import SETTINGS, csr_cases  # noqa: E402
from tests.reference import lookup as ref  # noqa: E402
from tf_sc_embedding import ops  # noqa: E402


def _feature_rows(draw, samples_per_sc):
    """A random cut of a SparseCore's samples into features (empty: the CSR's order)."""
    if draw(st.booleans()):
        return ()
    cuts = sorted(draw(st.lists(st.integers(0, samples_per_sc), max_size=3)))
    bounds = [0] + cuts + [samples_per_sc]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _csr_args(case):
    return (case["row_pointers"], case["sample_ids"], case["token_ids"], case["gains"],
            np.int32(case["num_minibatches"]))


def _shard_kwargs(case, table_name):
    return dict(table_name=table_name, num_sparsecores_per_device=case["sc_arg"],
                num_replica=case["num_replica"])


def _group(case, feature_rows, table_name="grouped"):
    return ops.group_lookup_entries(
        *_csr_args(case), input_size=case["input_size"], table_rows=case["table_rows"],
        feature_rows_per_sc=feature_rows, **_shard_kwargs(case, table_name))


def _csr_lookup(case, table, feature_rows):
    return ops.xla_sparse_dense_matmul_with_csr_input(
        *_csr_args(case)[:4], embedding_table=table,
        num_minibatches_per_physical_sparse_core=np.int32(case["num_minibatches"]),
        input_size=case["input_size"], quantization_config_low=0.0,
        quantization_config_high=0.0, quantization_config_num_buckets=0,
        feature_rows_per_sc=feature_rows, **_shard_kwargs(case, "grouped"))


@settings(max_examples=300, **SETTINGS)
@given(case=csr_cases(), data=st.data(),
       dtype=st.sampled_from([tf.float32, tf.bfloat16, tf.float16]))
def test_grouped_lookup_matches_reference_and_csr_lookup(case, data, dtype):
    feature_rows = _feature_rows(data.draw, case["samples_per_sc"])
    row_begin, rows, gains = (t.numpy() for t in _group(case, feature_rows))
    expected = ref.group_lookup_entries(
        *_csr_args(case), case["input_size"], case["table_rows"],
        num_sparsecores_per_device=case["sc_arg"], num_replica=case["num_replica"],
        feature_rows_per_sc=feature_rows)
    np.testing.assert_array_equal(row_begin, expected[0])
    np.testing.assert_array_equal(rows, expected[1])
    np.testing.assert_array_equal(gains, expected[2])
    values = case["rng"].normal(size=(case["table_rows"], case["dim"])).astype(np.float32)
    # 16-bit rows live in variables (the tensor forms take float32, as TensorFlow's op does).
    table = tf.Variable(tf.cast(values, dtype)) if dtype != tf.float32 else values
    got = ops.sparse_dense_matmul_grouped(row_begin, rows, gains, table, table_name="grouped")
    assert got.shape == (case["input_size"], case["dim"]) and got.dtype == tf.float32
    # The CSR lookup's bits, in the same row order; a variable gives the tensor's bits.
    np.testing.assert_array_equal(got.numpy(), _csr_lookup(case, table, feature_rows).numpy())
    if dtype == tf.float32:
        np.testing.assert_array_equal(
            ops.sparse_dense_matmul_grouped(row_begin, rows, gains, tf.Variable(values),
                                            table_name="grouped").numpy(), got.numpy())
    widened = tf.cast(tf.cast(values, dtype), tf.float32).numpy()
    np.testing.assert_allclose(
        got.numpy(), ref.sparse_dense_matmul_grouped(row_begin, rows, gains, widened),
        rtol=1e-5, atol=1e-6)


def _case(seed=0):
    """A fixed small CSR (4 SparseCores, 6 rows per shard, 5 samples per SparseCore)."""
    rng = np.random.default_rng(seed)
    segments = {}
    for sc in range(4):
        for shard in range(4):
            entries = [(int(rng.integers(5)), int(rng.integers(6)), float(rng.normal()))
                       for _ in range(int(rng.integers(1, 5)))]
            segments[(sc, 0, shard)] = sorted(entries, key=lambda e: e[1])
    rp, sa, to, ga = ref.pack_csr(segments, 4, 1, 4)
    return dict(row_pointers=rp, sample_ids=sa, token_ids=to, gains=ga, num_minibatches=1,
                input_size=20, table_rows=24, sc_arg=4, num_replica=1, samples_per_sc=5)


TABLE = np.arange(24 * 3, dtype=np.float32).reshape(24, 3) / 10


def _grouped_lookup(row_begin, rows, gains, table=TABLE):
    return ops.sparse_dense_matmul_grouped(row_begin, rows, gains, table, table_name="video")


@pytest.mark.parametrize("change, message", [
    (lambda b, r, g: (b[:0], r, g), "at least one entry"),
    (lambda b, r, g: (b + 1, r, g), r"activation_row_begin\[0\] must be 0"),
    (lambda b, r, g: (np.concatenate([b[:3], b[2:3] - 1, b[3:]]), r, g), "decreases at 3"),
    (lambda b, r, g: (b, r[:-1], g), "but entry_rows has"),
    (lambda b, r, g: (b, r, g[:-1]), "entry_gains"),
    (lambda b, r, g: (b, np.where(np.arange(len(r)) == 2, 24, r), g),
     r"entry_rows\[2\] = 24 is outside the table's 24 rows"),
    (lambda b, r, g: (b, np.where(np.arange(len(r)) == 0, -3, r), g), r"entry_rows\[0\] = -3"),
    (lambda b, r, g: (b[:, None], r, g), "activation_row_begin must be rank 1"),
])
def test_malformed_groupings_are_invalid_arguments(change, message):
    row_begin, rows, gains = (t.numpy() for t in _group(_case(), ()))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*" + message):
        _grouped_lookup(*change(row_begin, rows, gains))
    # The next call, with the grouping as it came, runs as if nothing had failed.
    np.testing.assert_array_equal(_grouped_lookup(row_begin, rows, gains).numpy(),
                                  ref.sparse_dense_matmul_grouped(row_begin, rows, gains, TABLE))


def test_bad_tables_are_invalid_arguments():
    row_begin, rows, gains = _group(_case(), ())
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'video'.*must be float32, bfloat16 or float16"):
        _grouped_lookup(row_begin, rows, gains, tf.Variable(tf.zeros([24, 3], tf.float64)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*matrix"):
        _grouped_lookup(row_begin, rows, gains, tf.Variable(tf.zeros([24], tf.float32)))
    # A table with fewer rows than the grouping references.
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*outside the table"):
        _grouped_lookup(row_begin, rows, gains, tf.Variable(tf.zeros([6, 3], tf.float32)))


def test_bad_csrs_and_attributes_are_invalid_arguments():
    case = _case()
    bad = dict(case, token_ids=np.where(case["token_ids"] == 0, 7, case["token_ids"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'"):
        _group(bad, (), table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*must sum"):
        _group(case, (2, 2), table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'video'.*indexes rows with int32"):
        ops.group_lookup_entries(*_csr_args(case), input_size=20, table_rows=2 ** 31,
                                 **_shard_kwargs(case, "video"))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="table 'video'.*input_size must be below"):
        ops.group_lookup_entries(*_csr_args(case), input_size=2 ** 31 - 1, table_rows=24,
                                 **_shard_kwargs(case, "video"))


def test_no_activation_rows():
    row_begin = np.zeros([1], np.int32)
    empty_rows, empty_gains = np.zeros([0], np.int32), np.zeros([0], np.float32)
    got = _grouped_lookup(row_begin, empty_rows, empty_gains)
    assert got.shape == (0, 3)
