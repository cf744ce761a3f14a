"""The key-to-row map ops of open vocabularies (docs/dynamic_vocabulary.md) against the Python
reference of their semantics (tests/reference/key_row_map.py): worked examples, a property test
over random configurations and step sequences, the logical state's round trip, and bad input."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.reference import key_hashing
from tests.reference.key_row_map import ReferenceKeyRowMap
from tf_sc_embedding.ops import key_row_map
from tf_sc_embedding.ops.key_row_map import (STEP_STATS, STRING_STEP_STATS, KeyRowMap,
                                             KeyRowMapState, key_fingerprints)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])


def _keys(values):
    return tf.constant(values, tf.int64)


def test_worked_example_threshold_one():
    m = KeyRowMap("users", capacity=3)
    out = m.map_step(_keys([5, -3, 5, 7]), 0)
    np.testing.assert_array_equal(out.rows, [0, 1, 0, 2])
    np.testing.assert_array_equal(out.new_keys, [5, -3, 7])
    np.testing.assert_array_equal(out.new_rows, [0, 1, 2])
    out = m.map_step(_keys([8, 7, 8]), 1)
    np.testing.assert_array_equal(out.rows, [-1, 2, -1])
    stats = dict(zip(STEP_STATS, out.stats.numpy()))
    assert stats["refused_keys"] == 1 and stats["unadmitted_ids"] == 2
    state = m.export()
    assert int(state.last_step) == 1
    np.testing.assert_array_equal(state.keys, [-3, 5, 7])
    np.testing.assert_array_equal(state.last_seen, [0, 0, 1])
    np.testing.assert_array_equal(m.sizes(), [3, 0, 1])


def test_admission_threshold_reads_the_row_in_the_admitting_step():
    m = KeyRowMap("users", capacity=4, admission_threshold=3)
    np.testing.assert_array_equal(m.map_step(_keys([9, 9, 4]), 0).rows, [-1, -1, -1])
    out = m.map_step(_keys([4, 9, 1, 1, 9, 1]), 1)
    np.testing.assert_array_equal(out.rows, [-1, 0, 1, 1, 0, 1])
    state = m.export()
    np.testing.assert_array_equal(state.pending_keys, [4])
    np.testing.assert_array_equal(state.pending_counts, [2])


def test_extreme_keys_are_distinct():
    keys = [np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max]
    m = KeyRowMap("users", capacity=8)
    out = m.map_step(_keys(keys), 0)
    assert len(set(out.rows.numpy().tolist())) == 5
    np.testing.assert_array_equal(m.export().keys, sorted(keys))


def test_works_inside_tf_function():
    m = KeyRowMap("users", capacity=16, admission_threshold=2)

    @tf.function
    def step(keys, s):
        return m.map_step(keys, s).rows

    np.testing.assert_array_equal(step(_keys([3, 3, 4]), tf.constant(0, tf.int64)), [0, 0, -1])
    np.testing.assert_array_equal(step(_keys([4]), tf.constant(1, tf.int64)), [1])


def _numbered(rows):
    """Reference of number_rows: the distinct rows in order of first occurrence, and the index of
    each row among them."""
    index = {}
    positions = [index.setdefault(int(row), len(index)) for row in rows]
    return np.array(list(index), np.int32), np.array(positions, np.int32)


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_number_rows_numbers_the_last_steps_rows_and_rejects_others(key_dtype):
    m = KeyRowMap("users", capacity=3, key_dtype=key_dtype)
    keys = (lambda *k: tf.constant(k, tf.int64)) if key_dtype == tf.int64 else (
        lambda *k: tf.constant([str(x) for x in k]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users'.*rows.0. = 0 was not "
                       "given: the map has mapped no step yet"):
        m.number_rows(tf.constant([0]))   # before any step no row was given
    first = m.map_step(keys(7, 8, 7, 9, 6), 0).rows
    np.testing.assert_array_equal(first, [0, 1, 0, 2, -1])
    positions, unique = m.number_rows(first)
    np.testing.assert_array_equal(positions, [0, 1, 0, 2, 3])
    np.testing.assert_array_equal(unique, [0, 1, 2, -1])
    m.map_step(keys(8), 1)
    before = m.export()
    for rows, message in (([1, 0], r"rows\[1\] = 0 was not given in step 1"),
                          ([1, 3], r"rows\[1\] = 3 is not a row of this map \(3 rows\)"),
                          ([-2], r"rows\[0\] = -2 is not a row")):
        with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users'.*" + message):
            m.number_rows(tf.constant(rows))
    positions, unique = m.number_rows(tf.constant([-1, 1, -1, 1]))
    np.testing.assert_array_equal(positions, [0, 1, 0, 1])
    np.testing.assert_array_equal(unique, [-1, 1])
    after = m.export()
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@st.composite
def map_cases(draw):
    config = dict(capacity=draw(st.integers(1, 24)),
                  admission_threshold=draw(st.integers(1, 3)),
                  steps_to_live=draw(st.integers(0, 3)),
                  pending_capacity=draw(st.integers(1, 16)))
    universe = draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=40,
                             unique=True))
    steps, step = [], 0
    for _ in range(draw(st.integers(1, 12))):
        step += draw(st.integers(0, 3))
        steps.append((step, draw(st.lists(st.sampled_from(universe), max_size=30))))
    return config, steps


@settings(max_examples=150, **SETTINGS)
@given(case=map_cases())
def test_map_matches_reference(case):
    config, steps = case
    m = KeyRowMap("t", **config)
    reference = ReferenceKeyRowMap(**config)
    held_rows = {}
    for step, keys in steps:
        out = m.map_step(tf.constant(keys, tf.int64, shape=[len(keys)]), step)
        has_row, admitted, stats = reference.map_step(keys, step)
        rows = out.rows.numpy()
        np.testing.assert_array_equal(rows != -1, has_row)
        assert out.new_keys.numpy().tolist() == admitted
        got = dict(zip(STEP_STATS, out.stats.numpy().tolist()))
        for name, value in stats.items():
            assert got[name] == value, name
        positions, unique = m.number_rows(out.rows)   # before the export: it changes nothing
        expected_unique, expected_positions = _numbered(rows)
        np.testing.assert_array_equal(unique, expected_unique)
        np.testing.assert_array_equal(positions, expected_positions)
        step_rows = {}
        for key, row in zip(keys, rows):
            if row == -1:
                continue
            assert 0 <= row < config["capacity"]
            assert step_rows.setdefault(key, row) == row
            if key not in admitted and key in held_rows:
                assert held_rows[key] == row
        state = m.export()
        expected = reference.export()
        got_state = (int(state.last_step), state.keys.numpy().tolist(),
                     state.last_seen.numpy().tolist(), state.pending_keys.numpy().tolist(),
                     state.pending_counts.numpy().tolist(),
                     state.pending_last_seen.numpy().tolist())
        assert got_state == expected
        assert len(set(state.rows.numpy().tolist())) == len(state.rows.numpy())
        held_rows = dict(zip(state.keys.numpy().tolist(), state.rows.numpy().tolist()))


def test_import_continues_like_the_exported_map():
    config = dict(capacity=6, admission_threshold=2, steps_to_live=3)
    m = KeyRowMap("users", **config)
    m.map_step(_keys([10, -20, 10, 30]), 0)
    m.map_step(_keys([30, 40, 40, -20]), 2)
    restored = KeyRowMap("users", **config)
    restored.import_state(m.export())
    np.testing.assert_array_equal(restored.export().rows, [0, 1, 2, 3])
    nxt = _keys([10, 50, 50, 60, -20, 30])
    a, b = m.map_step(nxt, 4), restored.map_step(nxt, 4)
    np.testing.assert_array_equal(a.rows.numpy() == -1, b.rows.numpy() == -1)
    np.testing.assert_array_equal(a.new_keys, b.new_keys)
    sa, sb = m.export(), restored.export()
    for field in ("last_step", "keys", "last_seen", "pending_keys", "pending_counts",
                  "pending_last_seen"):
        np.testing.assert_array_equal(getattr(sa, field), getattr(sb, field), err_msg=field)


def test_bad_input_names_the_table_and_changes_nothing():
    for bad in (dict(capacity=0), dict(capacity=4, admission_threshold=0),
                dict(capacity=4, steps_to_live=-1), dict(capacity=4, pending_capacity=0)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users'"):
            KeyRowMap("users", **bad)
    m = KeyRowMap("users", capacity=2)
    m.map_step(_keys([1, 2]), 5)
    before = m.export()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'users': step 4 comes before the last mapped step 5"):
        m.map_step(_keys([3]), 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users': keys must be a"):
        m.map_step(tf.constant([[1]], tf.int64), 6)
    too_many = before._replace(keys=_keys([1, 2, 3]),
                               last_seen=tf.constant([0, 0, 0], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'users': the saved state holds 3 keys, more than the "
                             "capacity of 2 rows"):
        m.import_state(too_many)
    unsorted = before._replace(keys=_keys([2, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="strictly ascending"):
        m.import_state(unsorted)
    after = m.export()
    for field in KeyRowMapState._fields:
        np.testing.assert_array_equal(getattr(before, field), getattr(after, field))
    # The failed calls left the map working.
    np.testing.assert_array_equal(m.map_step(_keys([2, 1]), 6).rows, [1, 0])


# ---------------------------------------------------------------------------- string keys

def test_string_keys_follow_the_same_rules():
    m = KeyRowMap("words", capacity=3, admission_threshold=2, key_dtype=tf.string)
    np.testing.assert_array_equal(m.map_step(["b", "a", "b"], 0).rows, [0, -1, 0])
    out = m.map_step(tf.constant(["a", "c", "zz", "c"]), 1)
    np.testing.assert_array_equal(out.rows, [1, 2, -1, 2])
    assert out.new_keys.numpy().tolist() == [b"a", b"c"]
    np.testing.assert_array_equal(out.new_rows, [1, 2])
    stats = dict(zip(STRING_STEP_STATS, out.stats.numpy()))
    assert stats["admitted_keys"] == 2 and stats["collided_ids"] == 0
    state = m.export()
    assert state.keys.numpy().tolist() == [b"a", b"b", b"c"]
    np.testing.assert_array_equal(state.fingerprints, key_fingerprints(["a", "b", "c"]))
    np.testing.assert_array_equal(state.pending_fingerprints, key_fingerprints(["zz"]))


def test_string_state_round_trip_and_errors():
    m = KeyRowMap("words", capacity=4, steps_to_live=2, key_dtype=tf.string)
    m.map_step(["x", "", "héllo", "x"], 0)
    m.map_step(["y"], 1)
    restored = KeyRowMap("words", capacity=4, steps_to_live=2, key_dtype=tf.string)
    restored.import_state(m.export())
    a, b = m.export(), restored.export()
    assert a.keys.numpy().tolist() == b.keys.numpy().tolist() == [b"", b"h\xc3\xa9llo", b"x",
                                                                 b"y"]
    np.testing.assert_array_equal(a.last_seen, b.last_seen)
    nxt = ["y", "new", "x"]
    np.testing.assert_array_equal(m.map_step(nxt, 3).rows == -1,
                                  restored.map_step(nxt, 3).rows == -1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 'words': the saved key 'x' appears twice"):
        restored.import_state(b._replace(keys=tf.constant(["x", "x", "y", "z"])))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'words': the saved state "
                                                             "holds 5 keys"):
        restored.import_state(b._replace(keys=tf.constant(["p", "q", "r", "s", "t"]),
                                         last_seen=tf.zeros([5], tf.int32)))
    with pytest.raises(ValueError, match="table 'words': key_dtype must be tf.int64 or "
                                         "tf.string, got int32"):
        KeyRowMap("words", capacity=4, key_dtype=tf.int32)
    from tf_sc_embedding._library import library  # noqa: PLC0415
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'words': keys and "
                                                             "fingerprints must be vectors"):
        library.sce_string_key_row_map_step(handle=m.resource_handle, keys=["a", "b"],
                                            fingerprints=tf.constant([1], tf.int64),
                                            step=tf.constant(9, tf.int64))


def test_a_map_dropped_while_a_function_is_traced_is_destroyed_at_once():
    """The destroy op runs eagerly wherever the last reference dies; added to the graph being
    traced (or to the dead graph the map was made in), it would never run, or wait for that
    graph's lock (a hang the op fuzzer found)."""
    import gc  # noqa: PLC0415
    from tf_sc_embedding._library import library  # noqa: PLC0415
    holder = []

    @tf.function
    def make():
        holder.append(KeyRowMap("t", capacity=4))
        return holder[-1].map_step(tf.constant([5], tf.int64), 0).rows

    np.testing.assert_array_equal(make(), [0])
    handle = holder[0].resource_handle

    @tf.function
    def drop(x):
        holder.clear()
        gc.collect()
        return x + 1

    assert int(drop(tf.constant(1))) == 2
    with pytest.raises(tf.errors.NotFoundError):
        library.sce_key_row_map_size(handle=handle)


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_find_reads_rows_without_changing_the_map(key_dtype):
    as_keys = ((lambda ks: tf.constant([str(k).encode() for k in ks])) if key_dtype == tf.string
               else (lambda ks: tf.constant(ks, tf.int64)))
    m = KeyRowMap("items", capacity=4, admission_threshold=2, steps_to_live=1,
                  key_dtype=key_dtype)
    m.map_step(as_keys([1, 1, 2, -3, -3]), 0)
    m.map_step(as_keys([-3]), 1)
    before = m.export()
    rows = m.find(as_keys([1, 2, -3, 9])).numpy()
    state = m.export()
    held = dict(zip([k.decode() if isinstance(k, bytes) else str(k) for k in
                     state.keys.numpy().tolist()], state.rows.numpy().tolist()))
    assert rows.tolist() == [held["1"], -1, held["-3"], -1]
    for a, b in zip(before, state):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    m.map_step(as_keys([2]), 2)   # key 1 (last seen at 0) has expired by step 2
    assert m.find(as_keys([1])).numpy().tolist() == [-1]


# ----------------------------------------------------------------------------- key hashes
def test_owner_shards_and_keyed_uniforms_match_the_reference():
    """SceKeyOwnerShards and SceKeyedRandomRows' uniforms against the numpy mirror of the core's mix."""
    rng = np.random.default_rng(3)
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 200, dtype=np.int64)
    keys[:3] = [0, -1, np.iinfo(np.int64).max]
    for shards in (1, 2, 3, 4, 8):
        got = key_row_map.key_owner_shards(keys, shards).numpy()
        np.testing.assert_array_equal(got, [key_hashing.owner_shard(k, shards) for k in keys])
    seed = -77   # any int64, negative included
    got = key_row_map.keyed_random_rows(keys, seed, 5, "uniform", 0.0, 1.0).numpy()
    want = np.array([[key_hashing.keyed_uniform(seed, k, c) for c in range(5)] for k in keys])
    np.testing.assert_array_equal(got, want)
    assert np.all((got > 0) & (got < 1))
    assert key_row_map.keyed_random_rows(keys[:0], seed, 5, "normal", 0, 1).shape == (0, 5)


@pytest.mark.parametrize("distribution,a,b", [("uniform", -0.5, 0.25), ("normal", 1.0, 0.5),
                                              ("truncated_normal", 0.0, 0.1)])
def test_keyed_random_rows_match_the_reference_however_many_are_drawn(distribution, a, b):
    """SceKeyedRandomRows against the numpy mirror (the inverse normal distribution function of
    Python's statistics module); a row is the same drawn alone or among others."""
    keys = np.arange(-300, 300, 3, dtype=np.int64) * 1000003
    got = key_row_map.keyed_random_rows(keys, 5, 3, distribution, a, b).numpy()
    want = np.array([[key_hashing.keyed_value(5, k, c, distribution, a, b) for c in range(3)]
                     for k in keys])
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-7)
    for i in (0, 17, len(keys) - 1):
        alone = key_row_map.keyed_random_rows(keys[i:i + 1], 5, 3, distribution, a, b).numpy()
        np.testing.assert_array_equal(alone[0], got[i])
    if distribution == "truncated_normal":
        assert np.all(np.abs(got) <= 2 * b)


def _grouped_by_owner(keys, shards):
    """numpy reference of group_keys_by_owner: distinct keys by first appearance, then a stable
    sort by owner shard (key_hashing's mirror of the core's mix)."""
    unique, first, position, counts = np.unique(keys, return_index=True, return_inverse=True,
                                                return_counts=True)
    by_appearance = np.argsort(first, kind="stable")
    owners = np.array([key_hashing.owner_shard(k, shards) for k in unique[by_appearance]],
                      np.int64)
    order = by_appearance[np.argsort(owners, kind="stable")]
    place = np.empty(len(unique), np.int64)
    place[order] = np.arange(len(unique))
    return (unique[order], counts[order], np.bincount(owners, minlength=shards),
            place[position.reshape(-1)])


@settings(max_examples=60, **SETTINGS)
@given(keys=st.lists(st.one_of(st.integers(-5, 5),
                               st.integers(-2**63, 2**63 - 1)), max_size=200),
       shards=st.integers(1, 5))
def test_group_keys_by_owner_matches_unique_and_a_stable_owner_sort(keys, shards):
    """SceGroupKeysByOwner (the key exchange's first step) against tf.unique's first-appearance
    order grouped stably by owner, in numpy: the order in which owners map the keys."""
    keys = np.array(keys, np.int64)
    got = key_row_map.group_keys_by_owner(keys, shards)
    want = _grouped_by_owner(keys, shards)
    for name, g, w in zip(got._fields, got, want):
        np.testing.assert_array_equal(g.numpy(), w, err_msg=name)
    assert got.owner_counts.shape == (shards,)


def test_group_keys_by_owner_rejects_bad_input():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="vector|rank"):
        key_row_map.group_keys_by_owner(tf.zeros([2, 2], tf.int64), 2, "users")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        key_row_map.group_keys_by_owner(tf.zeros([2], tf.int64), 0)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64)])   # rank known only to the kernel
    def grouped(keys):
        return key_row_map.group_keys_by_owner(keys, 2, "users")

    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users': keys must be a"):
        grouped(tf.zeros([2, 2], tf.int64))


def test_repeat_indices_repeat_each_key_its_count_and_reject_negative_counts():
    np.testing.assert_array_equal(key_row_map.repeat_indices([2, 0, 1, 3]),
                                  [0, 0, 2, 3, 3, 3])
    assert key_row_map.repeat_indices(tf.zeros([0], tf.int32)).shape == (0,)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 'users': counts\[1\] = -2 is negative"):
        key_row_map.repeat_indices([1, -2], "users")
    with pytest.raises(tf.errors.InvalidArgumentError, match="sum to more than"):
        key_row_map.repeat_indices([2**31 - 1, 1], "users")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="vector|rank"):
        key_row_map.repeat_indices(tf.zeros([2, 2], tf.int32))


def test_key_hash_ops_reject_bad_shapes():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="vector|rank"):
        key_row_map.key_owner_shards(tf.zeros([2, 2], tf.int64), 2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="vector|rank"):
        key_row_map.keyed_random_rows(tf.zeros([2, 2], tf.int64), 1, 3, "normal", 0, 1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        key_row_map.key_owner_shards(tf.zeros([2], tf.int64), 0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        key_row_map.keyed_random_rows(tf.zeros([2], tf.int64), 1, -1, "normal", 0, 1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        key_row_map.keyed_random_rows(tf.zeros([2], tf.int64), 1, 2, "lognormal", 0, 1)


def test_rows_to_reset_come_with_their_keys():
    """RowsToReset lists each new row with the key it was given to (a string's fingerprint)."""
    m = key_row_map.KeyRowMap("t", capacity=4)
    m.map_step(tf.constant([7, -2, 7], tf.int64), 0)
    listed = m.rows_to_reset()
    assert sorted(listed.keys.numpy().tolist()) == [-2, 7]
    found = m.find(listed.keys).numpy()
    np.testing.assert_array_equal(found, listed.rows.numpy())
    s = key_row_map.KeyRowMap("s", capacity=4, key_dtype=tf.string)
    s.map_step(tf.constant([b"a", b"b"]), 0)
    listed = s.rows_to_reset()
    np.testing.assert_array_equal(
        np.sort(listed.keys.numpy()),
        np.sort(key_row_map.key_fingerprints(tf.constant([b"a", b"b"])).numpy()))


def test_encoded_states_decode_to_the_same_state():
    """encode_state / decode_state (how workers gather map states): every field, its dtype and
    shape survive, for int64 and string maps, empty or not, odd string lengths included."""
    int_map = key_row_map.KeyRowMap("t", capacity=4, admission_threshold=2)
    string_map = key_row_map.KeyRowMap("s", capacity=4, admission_threshold=2,
                                       key_dtype=tf.string)
    for m, keys in ((int_map, tf.constant([7, -2, 7, 5], tf.int64)),
                    (string_map, tf.constant([b"", b"abc", b"", b"\x00\xff12345678"]))):
        for _ in range(2):   # empty, then after a step
            state = type(m.export())(*[np.asarray(t) for t in m.export()])
            back = key_row_map.decode_state(state, key_row_map.encode_state(state))
            for name, want, got in zip(state._fields, state, back):
                assert np.asarray(got).dtype == np.asarray(want).dtype, name
                np.testing.assert_array_equal(got, want, err_msg=name)
            m.map_step(keys, 0)
