"""ScePackReplicaChunks / SceUnpackReplicaChunks (tf_sc_embedding/ops/replica_chunks.py,
cc/core/replica_chunks.h): against a numpy reference of the buffer layout, round trips, and bad
input (InvalidArgument, nothing crashes)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tf_sc_embedding.ops.replica_chunks import (pack_gathered_replica_chunks,  # noqa: E402
                                                 pack_replica_chunks, unpack_replica_chunks)

SETTINGS = dict(deadline=None, max_examples=80,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reference_pack(values, counts, chunk):
    """Chunk d: for each table t, its next counts[d, t] entries (flattened), then zeros."""
    W = counts.shape[0]
    buffer = np.zeros(W * chunk, values[0].dtype)
    taken = [0] * len(values)
    for d in range(W):
        at = d * chunk
        for t, v in enumerate(values):
            piece = v[taken[t]:taken[t] + counts[d, t]].reshape(-1)
            buffer[at:at + piece.size] = piece
            at += piece.size
            taken[t] += counts[d, t]
    return buffer


@st.composite
def cases(draw):
    W = draw(st.integers(1, 6))
    T = draw(st.integers(1, 4))
    ids = draw(st.booleans())
    widths = [None] * T if ids else [draw(st.sampled_from([1, 3, 8, 32])) for _ in range(T)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    counts = rng.integers(0, 6, size=(W, T)).astype(np.int32)
    if draw(st.booleans()):
        counts[rng.integers(0, W)] = 0    # a replica that gets nothing
    values = []
    for t in range(T):
        n = int(counts[:, t].sum())
        if ids:
            values.append(rng.integers(-2**31, 2**31 - 1, n).astype(np.int32))
        else:
            values.append(rng.normal(size=(n, widths[t])).astype(np.float32))
    used = max(int(sum(counts[d, t] * (widths[t] or 1) for t in range(T))) for d in range(W))
    chunk = used + draw(st.integers(0, 5))
    return values, counts, chunk, widths


@settings(**SETTINGS)
@given(cases())
def test_pack_matches_reference_and_unpack_inverts_it(case):
    values, counts, chunk, widths = case
    buffer = pack_replica_chunks(values, counts, chunk)
    np.testing.assert_array_equal(buffer.numpy(), reference_pack(values, counts, chunk))
    unpacked = unpack_replica_chunks(buffer, counts, widths)
    assert len(unpacked) == len(values)
    for got, want in zip(unpacked, values):
        np.testing.assert_array_equal(got.numpy(), want)


def test_unpack_reads_each_replica_chunk_in_replica_order():
    # Two replicas sent (chunk 4): replica 0 -> ids [1, 2] of table 0 and [7] of table 1;
    # replica 1 -> [3] of table 0 and nothing of table 1.
    buffer = np.array([1, 2, 7, 0, 3, 0, 0, 0], np.int32)
    counts = np.array([[2, 1], [1, 0]], np.int32)
    t0, t1 = unpack_replica_chunks(buffer, counts, [None, None])
    assert t0.numpy().tolist() == [1, 2, 3] and t1.numpy().tolist() == [7]


def test_in_tf_function_with_unknown_shapes():
    spec = [tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([], tf.int32)]

    @tf.function(input_signature=spec)
    def round_trip(rows, counts, chunk):
        return unpack_replica_chunks(pack_replica_chunks([rows], counts, chunk), counts, [2])[0]

    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    got = round_trip(rows, np.array([[3], [2]], np.int32), 7)
    np.testing.assert_array_equal(got.numpy(), rows)


def _pack(values, counts, chunk):
    return pack_replica_chunks([tf.constant(v) for v in values],
                               tf.constant(counts, tf.int32), chunk)


@pytest.mark.parametrize("values,counts,chunk,message", [
    ([np.zeros(3, np.int32)], [[2], [2]], 4, "add up to 4 entries"),
    ([np.zeros(3, np.int32)], [[4], [-1]], 4, "is negative"),
    ([np.zeros(3, np.int32)], [[3]], 2, "more than chunk = 2"),
    ([np.zeros((2, 4), np.float32)], [[2]], 7, "more than chunk = 7"),
    ([np.zeros(3, np.int32)], [[3]], -1, "chunk must be in"),
    ([np.zeros(3, np.int32)], [[3], [0], [0]], 2**27, "exceeds the limit"),
    ([np.zeros(3, np.int32)], [[3]], 2**30, "chunk must be in"),
    ([np.zeros(3, np.int32)], [3], 4, "counts must be"),
    ([np.zeros(3, np.int32)], [[3, 0]], 4, "counts must be"),
    ([np.zeros((1, 1, 1), np.int32)], [[1]], 4, "rank 1 or 2"),
    ([np.zeros((2, 0), np.float32)], [[2]], 4, "width"),
])
def test_pack_bad_input_is_invalid_argument(values, counts, chunk, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        _pack(values, counts, chunk)


@pytest.mark.parametrize("buffer,counts,widths,message", [
    (np.zeros(8, np.int32), [[2], [5]], [None], "more than chunk = 4"),
    (np.zeros(7, np.int32), [[2], [1]], [None], "equal chunks"),
    (np.zeros(8, np.int32), [[2], [2 ** 31 - 1]], [None], "more than chunk"),
    (np.zeros(8, np.int32), [[-2], [1]], [None], "is negative"),
    (np.zeros(8, np.float32), [[1], [1]], [5], "more than chunk = 4"),
    (np.zeros((2, 4), np.int32), [[1], [1]], [None], "buffer must be a vector"),
    (np.zeros(8, np.int32), np.zeros((0, 1)), [None], "counts must be"),
])
def test_unpack_bad_input_is_invalid_argument(buffer, counts, widths, message):
    from tf_sc_embedding._library import library  # the wrapper flattens nothing: call the op
    flat = all(w is None for w in widths)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        library.sce_unpack_replica_chunks(
            buffer=tf.constant(buffer), counts=tf.constant(counts, tf.int32), N=len(widths),
            widths=[1 if w is None else w for w in widths], flat=flat)


def test_mixed_widths_are_rejected_by_the_wrapper():
    with pytest.raises(ValueError, match="all None or all set"):
        unpack_replica_chunks(tf.zeros([4], tf.float32), tf.constant([[1, 1]]), [None, 2])


def test_a_failed_call_leaves_the_next_one_working():
    with pytest.raises(tf.errors.InvalidArgumentError):
        _pack([np.arange(3, dtype=np.int32)], [[3]], 1)
    got = _pack([np.arange(3, dtype=np.int32)], [[1], [2]], 2)
    assert got.numpy().tolist() == [0, 0, 1, 2]


@settings(**SETTINGS)
@given(cases(), st.integers(0, 2**31 - 1))
def test_gathered_pack_equals_pack_of_the_gathered_rows(case, seed):
    values, counts, chunk, widths = case
    if widths[0] is None:
        values = [v[:, None] for v in values]    # rows of width 1
    rng = np.random.default_rng(seed)
    params, indices = [], []
    for v in values:
        source = rng.normal(size=(v.shape[0] + 3, v.shape[1])).astype(np.float32)
        order = rng.permutation(source.shape[0])[:v.shape[0]].astype(np.int32)
        params.append(source)
        indices.append(order)
    got = pack_gathered_replica_chunks(params, indices, counts, chunk).numpy()
    want = reference_pack([p[i] for p, i in zip(params, indices)], counts, chunk)
    np.testing.assert_array_equal(got, want)


def test_gathered_pack_rejects_an_index_outside_params():
    params = [np.zeros((3, 2), np.float32)]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"indices\[0\]\[1\] = 3 is not a row of params\[0\] \(3 rows\)"):
        pack_gathered_replica_chunks(params, [np.array([0, 3], np.int32)],
                                     np.array([[2]], np.int32), 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="add up to 2 entries"):
        pack_gathered_replica_chunks(params, [np.array([0], np.int32)],
                                     np.array([[2]], np.int32), 4)


def test_unpack_pads_each_table_to_its_row_multiple():
    counts = np.array([[3, 1], [2, 0]], np.int32)
    values = [np.arange(10, dtype=np.float32).reshape(5, 2), np.ones((1, 3), np.float32)]
    buffer = pack_replica_chunks(values, counts, 9)
    first, second = unpack_replica_chunks(buffer, counts, [2, 3], row_multiples=[4, 1])
    np.testing.assert_array_equal(first.numpy(), np.concatenate([values[0], np.zeros((3, 2))]))
    np.testing.assert_array_equal(second.numpy(), values[1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_multiples has 1 entries"):
        unpack_replica_chunks(buffer, counts, [2, 3], row_multiples=[4])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row_multiples\[0\] = 0"):
        unpack_replica_chunks(buffer, counts, [2, 3], row_multiples=[0, 1])
