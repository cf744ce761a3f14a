"""SceGatheredSegmentSum (tf_sc_embedding/ops/segment_sum.py, cc/core/gathered_segment_sum.h):
against the entry-by-entry numpy reference and TensorFlow's gather * gains + unsorted_segment_sum
(bit for bit), its gradient, and bad input (InvalidArgument naming the table, nothing crashes)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tests.reference import segment_sum as ref  # noqa: E402
from tf_sc_embedding._library import library  # noqa: E402
from tf_sc_embedding.ops.segment_sum import (gathered_segment_sum,  # noqa: E402
                                           gathered_segment_sum_from_features,
                                           gathered_segment_sum_to_features)

SETTINGS = dict(deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def tensorflow_ops(rows, positions, gains, segment_ids, num_segments):
    """What the exchange used before the op: three TensorFlow ops."""
    return tf.math.unsorted_segment_sum(tf.gather(rows, positions) * gains[:, None],
                                        segment_ids, num_segments)


@st.composite
def cases(draw):
    """Structure from hypothesis, bulk data from a seeded generator. Segment counts reach past
    the op's 256 rows per parallel range, so several ranges run."""
    num_rows = draw(st.integers(1, 40))
    width = draw(st.sampled_from([1, 3, 8, 16, 17, 32, 33]))
    num_entries = draw(st.integers(0, 3000))
    num_segments = draw(st.sampled_from([1, 2, 7, 255, 256, 600, 2100]))
    seed = draw(st.integers(0, 2**31 - 1))
    sorted_segments = draw(st.booleans())
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(num_rows, width)).astype(np.float32)
    positions = rng.integers(0, num_rows, num_entries).astype(np.int32)
    gains = rng.normal(size=num_entries).astype(np.float32)
    segments = rng.integers(0, num_segments, num_entries).astype(np.int32)
    if sorted_segments:
        segments.sort()
    return rows, positions, gains, segments, num_segments


@settings(**SETTINGS)
@given(cases())
def test_matches_reference_and_tensorflow_bit_for_bit(case):
    rows, positions, gains, segments, num_segments = case
    got = gathered_segment_sum(rows, positions, gains, segments, num_segments).numpy()
    assert got.shape == (num_segments, rows.shape[1])
    np.testing.assert_array_equal(got, ref.gathered_segment_sum(*case))
    np.testing.assert_array_equal(got, tensorflow_ops(*case).numpy())


def test_in_tf_function_with_unknown_sizes_and_many_threads():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(500, 32)).astype(np.float32)
    positions = rng.integers(0, 500, 20000).astype(np.int32)
    gains = rng.random(20000).astype(np.float32)
    segments = rng.integers(0, 4096, 20000).astype(np.int32)
    spec = [tf.TensorSpec([None, 32], tf.float32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([], tf.int32)]
    fn = tf.function(gathered_segment_sum, input_signature=spec)
    got = fn(rows, positions, gains, segments, 4096)
    assert got.shape.as_list() == [4096, 32]
    np.testing.assert_array_equal(
        got.numpy(), ref.gathered_segment_sum(rows, positions, gains, segments, 4096))


@pytest.mark.parametrize("num_entries,num_segments,width", [(0, 5, 4), (0, 0, 4), (3, 4, 0),
                                                             (0, 0, 0)])
def test_empty(num_entries, num_segments, width):
    rows = np.ones((2, width), np.float32)
    zeros = np.zeros(num_entries, np.int32)
    got = gathered_segment_sum(rows, zeros, np.ones(num_entries, np.float32), zeros,
                               num_segments).numpy()
    assert got.shape == (num_segments, width)
    assert not got.any()


def test_gradient_matches_tensorflow_ops():
    rng = np.random.default_rng(7)
    rows = tf.constant(rng.normal(size=(30, 5)).astype(np.float32))
    positions = tf.constant(rng.integers(0, 30, 400).astype(np.int32))
    gains = tf.constant(rng.normal(size=400).astype(np.float32))
    segments = tf.constant(rng.integers(0, 300, 400).astype(np.int32))
    upstream = tf.constant(rng.normal(size=(300, 5)).astype(np.float32))

    def gradients(fn):
        with tf.GradientTape() as tape:
            tape.watch([rows, gains])
            loss = tf.reduce_sum(fn(rows, positions, gains, segments, 300) * upstream)
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, [rows, gains])]

    ours = gradients(gathered_segment_sum)
    theirs = gradients(tensorflow_ops)
    np.testing.assert_allclose(ours[0].numpy(), theirs[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[1].numpy(), theirs[1].numpy(), rtol=1e-5, atol=1e-5)


BAD = [
    # (rows shape, positions, gains, segments, num_segments, expected message part)
    ((4, 2), [0, 4], [1, 1], [0, 0], 2, "positions[1] = 4"),
    ((4, 2), [0, -1], [1, 1], [0, 0], 2, "positions[1] = -1"),
    ((4, 2), [0, 1], [1, 1], [0, 2], 2, "segment_ids[1] = 2"),
    ((4, 2), [0, 1], [1, 1], [-5, 0], 2, "segment_ids[0] = -5"),
    ((4, 2), [0, 1], [1, 1], [0, 0], -1, "num_segments"),
    ((4, 2), [0, 1], [1], [0, 0], 2, "one length"),
    ((4, 2), [0, 1], [1, 1], [0], 2, "one length"),
    ((0, 2), [0], [1], [0], 1, "positions[0] = 0"),
    ((4, 2**20), [], [], [], 2**10, "exceeds the limit"),
    ((4, 2), [2**31 - 1], [1], [0], 1, "positions[0]"),
]


@pytest.mark.parametrize("shape,positions,gains,segments,num_segments,message", BAD)
def test_bad_input_is_invalid_argument_naming_the_table(shape, positions, gains, segments,
                                                         num_segments, message):
    rows = tf.zeros(shape, tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'") as info:
        gathered_segment_sum(rows, tf.constant(positions, tf.int32),
                             tf.constant(gains, tf.float32), tf.constant(segments, tf.int32),
                             num_segments, table_name="video")
    assert message in str(info.value)


def test_bad_ranks_are_invalid_argument():
    with pytest.raises(tf.errors.InvalidArgumentError, match="rows must be rank 2"):
        gathered_segment_sum(tf.zeros([4]), [0], [1.0], [0], 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_segments must be a scalar"):
        # The wrapper casts num_segments; the generated op takes a vector as it is.
        library.sce_gathered_segment_sum(rows=tf.zeros([2, 2]), positions=[0], gains=[1.0],
                                         segment_ids=[0], num_segments=[1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one length"):
        gathered_segment_sum(tf.zeros([4, 2]), [[0]], [1.0], [0], 1)


def test_a_failed_call_leaves_the_next_one_working():
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(tf.errors.InvalidArgumentError):
        gathered_segment_sum(rows, [5], [1.0], [0], 1)
    got = gathered_segment_sum(rows, [2, 0], [1.0, 2.0], [0, 0], 1).numpy()
    np.testing.assert_array_equal(got, [[4.0, 7.0]])


@st.composite
def feature_cases(draw):
    """A stacked table of F features over S SparseCores; segment ids are stacked rows."""
    S = draw(st.integers(1, 4))
    per_sc = draw(st.lists(st.integers(0, 40), min_size=1, max_size=5))
    if sum(per_sc) == 0:
        per_sc[0] = 1
    width = draw(st.sampled_from([1, 8, 32, 33]))
    num_rows = draw(st.integers(1, 50))
    num_entries = draw(st.integers(0, 2000))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    rows = rng.normal(size=(num_rows, width)).astype(np.float32)
    positions = rng.integers(0, num_rows, num_entries).astype(np.int32)
    gains = rng.normal(size=num_entries).astype(np.float32)
    segments = np.sort(rng.integers(0, S * sum(per_sc), num_entries)).astype(np.int32)
    return rows, positions, gains, segments, S, per_sc


def split_per_feature(stacked, S, per_sc):
    """The stacked SparseCore-major matrix -> one matrix per feature (the unstacking rule)."""
    width = stacked.shape[1]
    blocks = stacked.reshape(S, sum(per_sc), width)
    starts = np.concatenate([[0], np.cumsum(per_sc)[:-1]])
    return [blocks[:, a:a + n].reshape(S * n, width) for a, n in zip(starts, per_sc)]


@settings(**SETTINGS)
@given(feature_cases())
def test_per_feature_forms_equal_the_stacked_sum_split_or_concatenated(case):
    rows, positions, gains, segments, S, per_sc = case
    stacked = ref.gathered_segment_sum(rows, positions, gains, segments, S * sum(per_sc))
    got = gathered_segment_sum_to_features(rows, positions, gains, segments, S, per_sc)
    for g, want in zip(got, split_per_feature(stacked, S, per_sc)):
        np.testing.assert_array_equal(g.numpy(), want)
    # Backward: per-feature gradients read in place equal the sum over their concatenation.
    grads = split_per_feature(np.random.default_rng(1).normal(
        size=(S * sum(per_sc), rows.shape[1])).astype(np.float32), S, per_sc)
    width = rows.shape[1]
    concatenated = np.concatenate([g.reshape(S, n, width) for g, n in zip(grads, per_sc)],
                                  axis=1).reshape(S * sum(per_sc), width)
    back = gathered_segment_sum_from_features(grads, segments, gains, positions, rows.shape[0],
                                              S, per_sc)
    np.testing.assert_array_equal(
        back.numpy(), ref.gathered_segment_sum(concatenated, segments, gains, positions,
                                               rows.shape[0]))


def gradient_case(seed, num_rows, num_positions, num_entries, S, per_sc, width=4):
    """(rows, positions < num_positions, gains, segments, per-feature loss weights) of one
    gradient check of the per-feature form."""
    rng = np.random.default_rng(seed)
    rows = tf.constant(rng.normal(size=(num_rows, width)).astype(np.float32))
    positions = rng.integers(0, num_positions, num_entries).astype(np.int32)
    gains = tf.constant(rng.normal(size=num_entries).astype(np.float32))
    segments = rng.integers(0, S * sum(per_sc), num_entries).astype(np.int32)
    weights = [tf.constant(rng.normal(size=(S * n, width)).astype(np.float32)) for n in per_sc]
    return rows, positions, gains, segments, weights


@settings(**SETTINGS)
@given(feature_cases(), st.integers(0, 5), st.randoms(use_true_random=False))
def test_row_indices_read_in_place_what_a_gather_would_copy(case, extra_rows, random):
    """rows[row_indices] read in place equal, bit for bit, the gathered rows summed."""
    rows, positions, gains, segments, S, per_sc = case
    table = np.random.default_rng(random.randrange(1 << 30)).normal(
        size=(rows.shape[0] + extra_rows, rows.shape[1])).astype(np.float32)
    indices = np.array(random.sample(range(table.shape[0]), rows.shape[0]), np.int32)
    table[indices] = rows
    got = gathered_segment_sum_to_features(table, positions, gains, segments, S, per_sc,
                                           row_indices=indices)
    want = gathered_segment_sum_to_features(rows, positions, gains, segments, S, per_sc)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_row_indices_gradient_is_the_gathered_gradient_scattered_and_bad_indices_fail():
    S, per_sc = 2, [2, 3]
    table, positions, gains, segments, weights = gradient_case(9, 9, 3, 20, S, per_sc)
    indices = np.array([7, 2, 4], np.int32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([table, gains])
        parts = gathered_segment_sum_to_features(table, positions, gains, segments, S, per_sc,
                                                 row_indices=indices)
        loss = tf.add_n([tf.reduce_sum(p * w) for p, w in zip(parts, weights)])
        gathered = gathered_segment_sum_to_features(tf.gather(table, indices), positions, gains,
                                                    segments, S, per_sc)
        reference_loss = tf.add_n([tf.reduce_sum(p * w) for p, w in zip(gathered, weights)])
    for got, want in zip(tape.gradient(loss, [table, gains]),
                         tape.gradient(reference_loss, [table, gains])):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(),
                                   tf.convert_to_tensor(want).numpy(), rtol=1e-6, atol=1e-6)
    one = np.ones(1, np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 'video'.*row_indices\[1\] = 9 is outside the 9 rows"):
        gathered_segment_sum_to_features(table, [0], one, [0], S, per_sc,
                                         row_indices=np.array([0, 9], np.int32),
                                         table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row_indices\[0\] = -1"):
        gathered_segment_sum_to_features(table, [0], one, [0], S, per_sc,
                                         row_indices=np.array([-1], np.int32))
    # A position beyond the indices (not beyond the table) fails too.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positions\[0\] = 2"):
        gathered_segment_sum_to_features(table, [2], one, [0], S, per_sc,
                                         row_indices=np.array([0, 1], np.int32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="row_indices|rank"):
        library.sce_gathered_segment_sum_to_features(
            rows=table, positions=[0], gains=one, segment_ids=[0],
            row_indices=[np.zeros((1, 1), np.int32)], N=2, sparse_cores=S,
            feature_rows_per_sc=per_sc)


def test_per_feature_gradient_matches_the_stacked_op():
    S, per_sc = 2, [3, 1, 2]
    rows, positions, gains, segments, weights = gradient_case(5, 7, 7, 30, S, per_sc)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([rows, gains])
        parts = gathered_segment_sum_to_features(rows, positions, gains, segments, S, per_sc)
        loss = tf.add_n([tf.reduce_sum(p * w) for p, w in zip(parts, weights)])
        stacked = gathered_segment_sum(rows, positions, gains, segments, 12)
        stacked_weights = np.concatenate([w.numpy().reshape(S, n, 4) for w, n in
                                          zip(weights, per_sc)], axis=1).reshape(12, 4)
        reference_loss = tf.reduce_sum(stacked * stacked_weights)
    for got, want in zip(tape.gradient(loss, [rows, gains]),
                         tape.gradient(reference_loss, [rows, gains])):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_per_feature_forms_reject_bad_input_naming_the_table():
    rows = np.zeros((2, 3), np.float32)
    one = np.zeros(1, np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 'video'.*segment_ids\[0\] = 6"):
        gathered_segment_sum_to_features(rows, [0], one, [6], 2, [1, 2], table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 'video'.*gradients\[1\] must be"):
        gathered_segment_sum_from_features([np.zeros((2, 3), np.float32),
                                            np.zeros((3, 3), np.float32)], [0], one, [0], 1, 2,
                                           [1, 2], table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="N = 2 features but feature_rows_per_sc has 3 entries"):
        gathered_segment_sum_from_features([np.zeros((2, 3), np.float32)] * 2, [0], one, [0], 1,
                                           2, [1, 1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positions\[0\] = 4"):
        gathered_segment_sum_from_features([np.zeros((2, 3), np.float32),
                                            np.zeros((2, 3), np.float32)], [4], one, [0], 1, 2,
                                           [1, 1])


def test_per_feature_forms_check_the_feature_count_and_take_rows_without_columns():
    one = np.ones(1, np.float32)
    # The raw op with N not matching feature_rows_per_sc (eager: no shape function runs).
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table 'video'.*N = 1 features"):
        library.sce_gathered_segment_sum_to_features(
            rows=np.zeros((2, 3), np.float32), positions=[0], gains=one, segment_ids=[0],
            row_indices=[], N=1, sparse_cores=2, feature_rows_per_sc=[1, 1], table_name="video")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"N = 3 features"):
        library.sce_gathered_segment_sum_from_features(
            gradients=[np.zeros((2, 3), np.float32)] * 3, positions=[0], gains=one,
            segment_ids=[0], num_segments=1, sparse_cores=2, feature_rows_per_sc=[1])
    # Width 0: empty rows, nothing read, no row table (whatever the number of stacked rows).
    parts = gathered_segment_sum_to_features(np.zeros((1, 0), np.float32), [0], one, [5], 4,
                                             [1, 2])
    assert [tuple(p.shape) for p in parts] == [(4, 0), (8, 0)]
    back = gathered_segment_sum_from_features([np.zeros((4, 0), np.float32),
                                               np.zeros((8, 0), np.float32)], [5], one, [0], 1,
                                              4, [1, 2])
    assert tuple(back.shape) == (1, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="stacked rows"):
        gathered_segment_sum_to_features(np.zeros((1, 0), np.float32), [0], one, [0], 4,
                                         [2**30])
