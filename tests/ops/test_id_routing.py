"""SceRouteIdsToOwners (tf_sc_embedding/ops/id_routing.py, cc/core/id_routing.h): against a numpy
reference of the owner / row rule of docs/layout.md#table-layout, and bad input; its partition
statistics against a numpy reference and the minibatch-splits op."""
import collections
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.ops.id_routing import route_ids_to_owners  # noqa: E402

SETTINGS = dict(deadline=None, max_examples=80,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reference_route(ids, W, S, R):
    """Unique ids grouped by owner, by row within an owner; counts; each id's unique index."""
    N = W * S
    owner_row = {int(c): ((c % N) // S, (c % N) % S * R + c // N) for c in ids}
    ordered = sorted(set(owner_row.values()))
    index = {key: k for k, key in enumerate(ordered)}
    rows = np.array([row for _, row in ordered], np.int32)
    counts = np.bincount([o for o, _ in ordered], minlength=W).astype(np.int32)
    positions = np.array([index[owner_row[int(c)]] for c in ids], np.int32)
    return rows, counts, positions


@st.composite
def cases(draw):
    W, S, R = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 300))
    n = draw(st.integers(0, 2000))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    hot = draw(st.booleans())   # many duplicates
    high = min(W * S * R, 20) if hot else W * S * R
    return rng.integers(0, high, n).astype(np.int32), W, S, R


@settings(**SETTINGS)
@given(cases())
def test_matches_reference(case):
    ids, W, S, R = case
    got = route_ids_to_owners(ids, W, S, R)
    rows, counts, positions = reference_route(ids, W, S, R)
    np.testing.assert_array_equal(got.rows.numpy(), rows)
    np.testing.assert_array_equal(got.counts.numpy(), counts)
    np.testing.assert_array_equal(got.positions.numpy(), positions)


def test_worked_example():
    # W = 2, S = 2, R = 3: N = 4 shards. id 5: shard 1 -> owner 0, row 1*3 + 1 = 4;
    # id 6: shard 2 -> owner 1, row 0*3 + 1 = 1; id 3: shard 3 -> owner 1, row 1*3 + 0 = 3.
    got = route_ids_to_owners(np.array([6, 5, 3, 6], np.int32), 2, 2, 3)
    assert got.rows.numpy().tolist() == [4, 1, 3]
    assert got.counts.numpy().tolist() == [1, 2]
    assert got.positions.numpy().tolist() == [1, 0, 2, 1]


def test_in_tf_function_with_unknown_length():
    fn = tf.function(lambda ids: route_ids_to_owners(ids, 2, 4, 10, table_name="t"),
                     input_signature=[tf.TensorSpec([None], tf.int32)])
    got = fn(np.arange(80, dtype=np.int32))
    assert got.counts.shape.as_list() == [2]
    assert got.counts.numpy().tolist() == [40, 40]


@pytest.mark.parametrize("ids,W,S,R,message", [
    ([0, 12], 2, 2, 3, "ids[1] = 12 is not a row"),
    ([-1], 2, 2, 3, "ids[0] = -1"),
    ([[1]], 2, 2, 3, "must be a vector"),
    ([0], 2**16, 2**10, 2**10, "exceeds the limit"),
    ([0], 2**17, 1, 1, "num_replicas"),
])
def test_bad_input_is_invalid_argument_naming_the_table(ids, W, S, R, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=re.escape(message)) as info:
        route_ids_to_owners(tf.constant(ids, tf.int32), W, S, R, table_name="video")
    if isinstance(info.value, tf.errors.InvalidArgumentError):
        assert "table 'video'" in str(info.value)


def test_a_failed_call_leaves_the_next_one_working():
    with pytest.raises(tf.errors.InvalidArgumentError):
        route_ids_to_owners(np.array([99], np.int32), 1, 1, 4)
    assert route_ids_to_owners(np.array([3, 3], np.int32), 1, 1, 4).rows.numpy().tolist() == [3]


# ---- partition statistics (max ids / max unique ids per (source SparseCore, target shard)) ----

_INT32_MAX = 2**31 - 1


def reference_maxima(rows, cols, W, S, rows_per_sc):
    """(max ids, max unique ids) over (source SC row // rows_per_sc, shard col % W*S) partitions:
    distinct (row, col) pairs and distinct cols per partition; (0, 0) without ids."""
    N = W * S
    ids, uniques = collections.Counter(), collections.Counter()
    for row, col in set(zip(rows.tolist(), cols.tolist())):
        ids[(row // rows_per_sc, col % N)] += 1
    for sc, col in set((r // rows_per_sc, c) for r, c in zip(rows.tolist(), cols.tolist())):
        uniques[(sc, col % N)] += 1
    return max(ids.values(), default=0), max(uniques.values(), default=0)


def splits_maxima(rows, cols, W, S, R, rows_per_sc, table_name="t"):
    """max_ids / max_uniques of the minibatch-splits op on the stacked COO (no limits,
    max_division_level 0, the table's W*S*R rows)."""
    gains = np.linspace(0.5, 2.0, len(rows)).astype(np.float32)
    splits = ops.get_minibatch_splits_with_physical_replica(
        tf.constant([""]), rows, cols, gains, sample_count=S * rows_per_sc, num_replica=W,
        table_vocab_size=W * S * R, feature_width=8, num_sc_per_chip=S, table_name=table_name,
        mini_batch_splits="", max_ids_per_partition=_INT32_MAX,
        max_unique_ids_per_partition=_INT32_MAX, max_division_level=0)
    return int(splits.max_ids), int(splits.max_uniques)


@st.composite
def stacked_coos(draw, power_of_two_shards=True):
    """A stacked COO: rows nondecreasing in [0, S * rows_per_sc), cols in [0, W*S*R), with ids
    repeated within a sample and (hot) many equal cols across samples."""
    W = draw(st.sampled_from([1, 2, 4] if power_of_two_shards else [1, 2, 3, 5]))
    S = draw(st.sampled_from([1, 2, 4]))
    R = draw(st.integers(1, 300))
    rows_per_sc = draw(st.integers(1, 40))
    n = draw(st.integers(0, 1500))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    hot = draw(st.booleans())
    high = min(W * S * R, draw(st.integers(1, 30))) if hot else W * S * R
    rows = rng.integers(0, S * rows_per_sc, n)
    cols = rng.integers(0, high, n)
    repeats = rng.integers(0, max(n, 1), draw(st.integers(0, 200))) if n else np.zeros(0, int)
    rows = np.concatenate([rows, rows[repeats]])   # the same (row, col) again
    cols = np.concatenate([cols, cols[repeats]])
    order = np.argsort(rows, kind="stable")         # rows sorted, each sample's ids in any order
    return rows[order].astype(np.int32), cols[order].astype(np.int32), W, S, R, rows_per_sc


@settings(**SETTINGS)
@given(stacked_coos())
def test_partition_maxima_match_the_splits_op_and_reference(case):
    rows, cols, W, S, R, rows_per_sc = case
    got = route_ids_to_owners(cols, W, S, R, row_ids=rows, rows_per_sparse_core=rows_per_sc,
                              table_name="t")
    expected = reference_maxima(rows, cols, W, S, rows_per_sc)
    assert (int(got.max_ids), int(got.max_unique_ids)) == expected
    assert splits_maxima(rows, cols, W, S, R, rows_per_sc) == expected
    # The statistics do not change the routing.
    plain = route_ids_to_owners(cols, W, S, R)
    for field in ("rows", "counts", "positions"):
        np.testing.assert_array_equal(getattr(got, field).numpy(), getattr(plain, field).numpy())


@settings(**dict(SETTINGS, max_examples=40))
@given(stacked_coos(power_of_two_shards=False))
def test_partition_maxima_with_any_number_of_shards(case):
    # The splits op needs W*S to be a power of two; the routing op takes any W*S (shard c mod N).
    rows, cols, W, S, R, rows_per_sc = case
    got = route_ids_to_owners(cols, W, S, R, row_ids=rows, rows_per_sparse_core=rows_per_sc)
    assert (int(got.max_ids), int(got.max_unique_ids)) == reference_maxima(rows, cols, W, S,
                                                                           rows_per_sc)


def test_partition_maxima_worked_example():
    # W = 2, S = 2, R = 3 (N = 4), 2 rows per SparseCore. SparseCore 0 (rows 0-1) sends ids 1, 5
    # and 9, all to shard 1: the (row, col) pairs (0,1), (0,5), (1,5) (twice in row 1: one id)
    # and (1,9) are 4 ids, 3 of them unique. SparseCore 1 (rows 2-3) sends id 2 from rows 2 and
    # 3 to shard 2: 2 ids, 1 unique.
    rows = np.array([0, 0, 1, 1, 1, 2, 3], np.int32)
    cols = np.array([1, 5, 5, 5, 9, 2, 2], np.int32)
    got = route_ids_to_owners(cols, 2, 2, 3, row_ids=rows, rows_per_sparse_core=2)
    assert (int(got.max_ids), int(got.max_unique_ids)) == (4, 3)
    assert splits_maxima(rows, cols, 2, 2, 3, 2) == (4, 3)
    empty = np.zeros([0], np.int32)
    got = route_ids_to_owners(empty, 2, 2, 3, row_ids=empty, rows_per_sparse_core=2)
    assert (int(got.max_ids), int(got.max_unique_ids)) == (0, 0)


def test_partition_maxima_in_tf_function_with_unknown_length():
    fn = tf.function(
        lambda ids, rows: route_ids_to_owners(ids, 2, 4, 10, row_ids=rows, rows_per_sparse_core=5),
        input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)])
    got = fn(np.arange(80, dtype=np.int32), np.repeat(np.arange(20, dtype=np.int32), 4))
    assert got.max_ids.shape.as_list() == [] and got.max_unique_ids.shape.as_list() == []
    # 80 distinct ids over 4 SCs x 8 shards, 20 per SC, 2.5 per shard on average: at most 3.
    assert (int(got.max_ids), int(got.max_unique_ids)) == reference_maxima(
        np.repeat(np.arange(20), 4), np.arange(80), 2, 4, 5)


@pytest.mark.parametrize("rows,message", [
    ([0, 1], "row_ids has 2 entries but ids has 3"),
    ([0, 1, 2, 3], "row_ids has 4 entries but ids has 3"),
    ([0, 8, 8], "row_ids[1] = 8 is not a sample row in [0, 8)"),
    ([-1, 0, 0], "row_ids[0] = -1 is not a sample row"),
    ([0, 3, 2], "row_ids[2] = 2 is smaller than row_ids[1] = 3"),
    ([[0, 1, 2]], "row_ids must be a vector"),
])
def test_bad_row_ids_are_invalid_argument_naming_the_table(rows, message):
    # W = 2, S = 2, R = 3, 4 rows per SparseCore: 8 samples.
    ids = tf.constant([1, 2, 3], tf.int32)
    written = tf.Variable(-7)

    @tf.function
    def route_and_write(row_ids):
        route = route_ids_to_owners(ids, 2, 2, 3, row_ids=row_ids, rows_per_sparse_core=4,
                                    table_name="video")
        written.assign(route.max_ids + route.max_unique_ids + tf.reduce_sum(route.positions))
        return route

    for call in (lambda r: route_ids_to_owners(ids, 2, 2, 3, row_ids=r, rows_per_sparse_core=4,
                                               table_name="video"),
                 route_and_write):
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)) as info:
            call(tf.constant(rows, tf.int32))
        assert "table 'video'" in str(info.value)
    assert int(written.numpy()) == -7   # the failed op produced nothing to write


def test_rows_per_sparse_core_beyond_int32_samples_is_invalid_argument():
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceeds the limit") as info:
        route_ids_to_owners(np.array([1], np.int32), 2, 4, 3, row_ids=np.array([0], np.int32),
                            rows_per_sparse_core=2**30, table_name="video")
    assert "table 'video'" in str(info.value)


@pytest.mark.parametrize("row_ids", [None, [], [5, 4, 3, 2, 1, 0, -9], [[1, 2]]])
def test_without_rows_per_sparse_core_the_statistics_are_zero_and_row_ids_unread(row_ids):
    ids = np.array([6, 5, 3, 6, 11, 0], np.int32)
    kwargs = {} if row_ids is None else dict(row_ids=tf.constant(row_ids, tf.int32,
                                                                 shape=np.shape(row_ids)))
    got = route_ids_to_owners(ids, 2, 2, 3, table_name="t", **kwargs)
    assert (int(got.max_ids), int(got.max_unique_ids)) == (0, 0)
    rows, counts, positions = reference_route(ids, 2, 2, 3)
    np.testing.assert_array_equal(got.rows.numpy(), rows)
    np.testing.assert_array_equal(got.counts.numpy(), counts)
    np.testing.assert_array_equal(got.positions.numpy(), positions)
