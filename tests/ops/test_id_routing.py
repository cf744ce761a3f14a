"""SceRouteIdsToOwners (tf_sc_embedding/ops/id_routing.py, cc/core/id_routing.h): against a numpy
reference of the owner / row rule of docs/layout.md#table-layout, and bad input."""
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

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
