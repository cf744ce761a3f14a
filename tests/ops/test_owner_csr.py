"""SceOwnerCsr (tf_sc_embedding/ops/owner_csr.py, cc/core/owner_csr.h): against a numpy reference
of the rule (the formula the exchange used in TensorFlow ops before the op), and bad input."""
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tf_sc_embedding.ops.owner_csr import owner_csr  # noqa: E402

SETTINGS = dict(deadline=None, max_examples=80,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PAD = 2**31 - 1


def reference(rows, W, S, R, replica_id):
    """Entry i is sample i % M of source SparseCore i // M; segment (source, shard) at key
    source * block + replica_id * S + shard, 8-aligned, entries in received order."""
    rows = np.asarray(rows, np.int64)
    n = rows.size
    block = -(-(S * W) // 8) * 8
    per_sc = -(-n // S)
    shard = rows // R
    i = np.arange(n)
    source = i // max(per_sc, 1)
    key = source * block + replica_id * S + shard
    order = np.argsort(key, kind="stable")      # entries grouped by segment, in received order
    counts = np.bincount(key, minlength=S * block)
    padded = (counts + 7) // 8 * 8
    begin = np.concatenate([[0], np.cumsum(padded)[:-1]])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - np.concatenate([[0], np.cumsum(counts)[:-1]])[key[order]]
    slot = begin[key] + rank
    total = int(padded.sum())
    tokens = np.full(total, PAD, np.int64)
    samples = np.full(total, PAD, np.int64)
    gains = np.full(total, float(PAD), np.float32)
    tokens[slot] = rows - shard * R
    samples[slot] = i - source * per_sc
    gains[slot] = 1.0
    return begin + counts, samples, tokens, gains, S * per_sc


@st.composite
def cases(draw):
    W, S, R = draw(st.integers(1, 5)), draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(1, 50))
    replica_id = draw(st.integers(0, W - 1))
    n = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    return rng.integers(0, S * R, n).astype(np.int32), W, S, R, replica_id


@settings(**SETTINGS)
@given(cases())
def test_matches_reference(case):
    rows, W, S, R, replica_id = case
    got = owner_csr(rows, W, S, R, replica_id)
    want = reference(rows, W, S, R, replica_id)
    for name, g, w in zip(got._fields, got, want):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=name)


def test_worked_example():
    # W = 1, S = 2, R = 10; rows 13 (shard 1, token 3), 4 (shard 0, token 4), 15 (shard 1,
    # token 5). M = 2, so entries 0 and 1 are samples 0 and 1 of source SparseCore 0 and entry 2
    # is sample 0 of source SparseCore 1: entry i reads gradient row i.
    got = owner_csr(np.array([13, 4, 15], np.int32), 1, 2, 10, 0)
    assert int(got.activation_rows) == 4
    pointers = got.row_pointers.numpy().tolist()
    # Segments (source 0, shard 0) at 0, (0, 1) at 8, (1, 1) at 16, each padded to 8 entries;
    # a pointer is its segment's start + count, an empty key points at the next free entry.
    assert len(pointers) == 2 * 8 and pointers[:3] == [1, 9, 16] and pointers[8:11] == [16, 17, 24]
    tokens = got.sorted_token_ids.numpy()
    assert tokens[0] == 4 and tokens[8] == 3 and tokens[16] == 5
    assert got.sorted_sample_ids.numpy()[[0, 8, 16]].tolist() == [1, 0, 0]


@pytest.mark.parametrize("rows,W,S,R,replica,message", [
    ([0, 20], 1, 2, 10, 0, "rows[1] = 20 is not a row"),
    ([-1], 1, 2, 10, 0, "rows[0] = -1"),
    ([[1]], 1, 2, 10, 0, "must be a vector"),
    ([0], 2, 2, 10, 2, "replica_id"),
    ([0], 1, 2**10, 2**30, 0, "exceeds the limit"),
])
def test_bad_input_is_invalid_argument_naming_the_table(rows, W, S, R, replica, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=re.escape(message)) as info:
        owner_csr(tf.constant(rows, tf.int32), W, S, R, replica, table_name="video")
    if isinstance(info.value, tf.errors.InvalidArgumentError):
        assert "table 'video'" in str(info.value)
