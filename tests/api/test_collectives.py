"""tf_sc_embedding/collectives/replica_group.py on its own (not through TPUEmbeddingV2): the collectives of
`ReplicaView` under MirroredStrategy on logical CPUs compared with numpy, the bytes-sent cost model
of the module docstring, `LocalView`, `ReplicaGroup`'s per-replica helpers and
`strategy_replicas`."""
import numpy as np
import pytest
import tensorflow as tf

from tests.devices import mirrored_strategy, require_replicas
from tf_sc_embedding.collectives import replica_group as collectives


def make_group(replicas):
    strategy = mirrored_strategy(replicas)
    group = collectives.ReplicaGroup(strategy)
    group.create_variables()
    return strategy, group


def per_replica(strategy, arrays):
    """The per-replica value whose part on replica r is arrays[r]."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(arrays[int(tf.get_static_value(ctx.replica_id_in_sync_group))]))


def run(strategy, group, fn, inputs, mode="function"):
    """fn(view, *inputs) on every replica; a list per replica of numpy results."""
    def replica_fn(*args):
        return fn(collectives.ReplicaView(group), *args)

    if mode == "eager":
        out = strategy.run(replica_fn, args=tuple(inputs))
    else:
        out = tf.function(lambda *a: strategy.run(replica_fn, args=a))(*inputs)
    return [tf.nest.map_structure(lambda t: t.numpy(), r)
            for r in strategy.experimental_local_results(out)]


# ------------------------------------------------------------------------------- collectives
@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("mode", ["function", "eager"])
def test_collectives_match_numpy(replicas, mode):
    require_replicas(replicas)
    strategy, group = make_group(replicas)
    w = replicas
    rng = np.random.default_rng(replicas)
    # all_to_all: [W, 3], row d goes to replica d.
    a2a = [rng.normal(size=(w, 3)).astype(np.float32) for _ in range(w)]
    # all_to_all of [W, 2, 2] int64: block d goes to replica d.
    a2a_int = [rng.integers(-100, 100, size=(w, 2, 2)).astype(np.int64) for _ in range(w)]
    gather = [rng.normal(size=(2, 5)).astype(np.float32) for _ in range(w)]
    summed = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(w)]
    maxed = [rng.integers(-50, 50, size=6).astype(np.int64) for _ in range(w)]
    maxed_f = [rng.normal(size=4).astype(np.float32) for _ in range(w)]
    ored = [np.int64(1 << (2 * r)) | np.int64(1 << 40) for r in range(w)]

    def fn(view, *args):
        x_a2a, x_a2a_int, x_gather, x_sum, x_max, x_max_f, x_or = args
        return dict(a2a=view.all_to_all(x_a2a), a2a_int=view.all_to_all(x_a2a_int),
                    gather=view.all_gather(x_gather), sum=view.all_sum(x_sum),
                    max=view.all_max(x_max), max_f=view.all_max(x_max_f), bor=view.all_or(x_or),
                    replica_id=tf.constant(view.replica_id))

    inputs = [per_replica(strategy, v) for v in (a2a, a2a_int, gather, summed, maxed, maxed_f,
                                                 ored)]
    results = run(strategy, group, fn, inputs, mode)
    assert len(results) == w
    for r, got in enumerate(results):
        assert got["replica_id"] == r
        np.testing.assert_array_equal(got["a2a"], np.stack([a2a[s][r] for s in range(w)]))
        np.testing.assert_array_equal(got["a2a_int"], np.stack([a2a_int[s][r] for s in range(w)]))
        np.testing.assert_array_equal(got["gather"], np.concatenate(gather))
        np.testing.assert_allclose(got["sum"], np.sum(summed, axis=0), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got["max"], np.max(maxed, axis=0))
        np.testing.assert_array_equal(got["max_f"], np.max(maxed_f, axis=0))
        expected_or = np.int64(0)
        for v in ored:
            expected_or |= v
        assert got["bor"] == expected_or
        assert got["bor"].dtype == np.int64


def test_repeated_calls_of_one_traced_step_use_fresh_instances():
    # Instance keys are handed out per call: the same traced step runs again with other values
    # (and the collective's shapes could differ from call to call).
    strategy, group = make_group(2)
    step = tf.function(lambda x: strategy.run(
        lambda v: collectives.ReplicaView(group).all_gather(v), args=(x,)),
        reduce_retracing=True)
    for call, rows in enumerate((2, 3, 1, 3)):
        values = [np.full((rows, 2), 10 * call + r, np.float32) for r in range(2)]
        out = strategy.experimental_local_results(step(per_replica(strategy, values)))
        for got in out:
            np.testing.assert_array_equal(got.numpy(), np.concatenate(values))


def test_replica_view_needs_replica_context_with_several_replicas():
    strategy, group = make_group(2)
    with pytest.raises(RuntimeError, match="strategy.run"):
        collectives.ReplicaView(group)
    with strategy.scope():
        with pytest.raises(RuntimeError, match="strategy.run"):
            collectives.ReplicaView(group)


def test_replica_view_of_one_replica_is_the_identity():
    group = collectives.ReplicaGroup(tf.distribute.get_strategy())
    view = collectives.ReplicaView(group)
    assert view.num_replicas == 1 and view.replica_id == 0
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    for op in (view.all_to_all, view.all_gather, view.all_sum, view.all_max):
        assert op(x) is x
    flags = tf.constant(5, tf.int64)
    assert view.all_or(flags) is flags


# ---------------------------------------------------------------------------------- LocalView
def test_local_view_is_the_identity():
    view = collectives.LocalView()
    assert view.num_replicas == 1 and view.replica_id == 0
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    for op in (view.all_to_all, view.all_gather, view.all_sum, view.all_max, view.all_or,
               collectives.LocalView.all_to_all, collectives.LocalView.all_sum):
        assert op(x) is x


def test_local_view_launches_no_collective_under_several_replicas():
    strategy, group = make_group(2)
    view = collectives.LocalView()

    def replica_fn(x):
        return view.all_sum(view.all_gather(view.all_to_all(x))) + 1.0

    step = tf.function(lambda x: strategy.run(replica_fn, args=(x,)))
    values = [np.full((2, 2), r, np.float32) for r in range(2)]
    inputs = per_replica(strategy, values)
    graph = step.get_concrete_function(inputs).graph
    assert not [op.type for op in graph.get_operations() if op.type.startswith("Collective")]
    for r, got in enumerate(strategy.experimental_local_results(step(inputs))):
        np.testing.assert_array_equal(got.numpy(), values[r] + 1.0)
    assert group.bytes_sent() == {0: 0, 1: 0}


# ------------------------------------------------------------------------------ bytes_sent
@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_bytes_sent_follow_the_cost_model(replicas):
    require_replicas(replicas)
    strategy, group = make_group(replicas)
    w = replicas
    assert group.bytes_sent() == {r: 0 for r in range(w)}
    a2a = np.zeros((w, 4, 6), np.float32)         # every replica the same size
    gather = np.zeros((3, 5), np.int64)
    summed = np.zeros((w * 8,), np.float32)
    nbytes = {k: v.nbytes for k, v in (("a2a", a2a), ("gather", gather), ("sum", summed))}
    expected = {"all_to_all": nbytes["a2a"] * (w - 1) // w,
                "all_gather": nbytes["gather"] * (w - 1),
                "all_sum": nbytes["sum"] * 2 * (w - 1) // w}
    total = 0
    for kind, value in (("all_to_all", a2a), ("all_gather", gather), ("all_sum", summed)):
        inputs = [per_replica(strategy, [value] * w)]
        run(strategy, group, lambda view, x, kind=kind: getattr(view, kind)(x), inputs)
        total += expected[kind]
        assert group.bytes_sent() == {r: total for r in range(w)}, kind

    # all_max gathers the 1-D value; all_or gathers one int64.
    values = [np.arange(7, dtype=np.int64) + r for r in range(w)]
    run(strategy, group, lambda view, x: view.all_max(x), [per_replica(strategy, values)])
    total += 7 * 8 * (w - 1)
    assert group.bytes_sent() == {r: total for r in range(w)}
    run(strategy, group, lambda view, x: view.all_or(x),
        [per_replica(strategy, [np.int64(r) for r in range(w)])])
    total += 8 * (w - 1)
    assert group.bytes_sent() == {r: total for r in range(w)}

    group.reset_bytes_sent()
    assert group.bytes_sent() == {r: 0 for r in range(w)}


def test_bytes_sent_are_counted_per_call_and_per_replica_size():
    strategy, group = make_group(2)
    step = tf.function(lambda x: strategy.run(
        lambda v: collectives.ReplicaView(group).all_gather(v), args=(x,)), reduce_retracing=True)
    # all_gather needs equal shapes on every replica; the size may change from call to call.
    total = 0
    for rows in (2, 5, 1):
        step(per_replica(strategy, [np.zeros((rows, 4), np.float32)] * 2))
        total += rows * 4 * 4
        assert group.bytes_sent() == {0: total, 1: total}
    group.reset_bytes_sent()
    # Eager and traced steps count alike.
    run(strategy, group, lambda view, x: view.all_to_all(x),
        [per_replica(strategy, [np.zeros((2, 8), np.float64)] * 2)], mode="eager")
    assert group.bytes_sent() == {0: 2 * 8 * 8 // 2, 1: 2 * 8 * 8 // 2}


def test_counters_exist_only_after_create_variables():
    strategy = mirrored_strategy(2)
    group = collectives.ReplicaGroup(strategy)
    assert group.counter(0) is None
    assert group.bytes_sent() == {}
    group.create_variables()
    for r, device in zip(group.local_replica_ids, group.local_devices):
        for name in collectives.COUNTERS:
            counter = group.counter(r, name)
            assert counter.dtype == tf.int64
            assert tf.DeviceSpec.from_string(counter.device) == \
                tf.DeviceSpec.from_string(device)
        assert group.ordering_token(r) is not None
    assert group.counter_values(collectives.SKIPPED_GRADIENT_ROWS) == {0: 0, 1: 0}
    first = group.counter(0)
    group.create_variables()   # idempotent
    assert group.counter(0) is first


# ------------------------------------------------------------------ ReplicaGroup per-replica values
def test_local_values_and_distribute_round_trip():
    strategy, group = make_group(2)
    values = [np.full((3,), r + 1, np.float32) for r in range(2)]
    pr = per_replica(strategy, values)
    shared = tf.constant(7)
    local = group.local_values({"x": pr, "shared": shared, "nested": [pr]})
    assert len(local) == 2
    for r, item in enumerate(local):
        assert set(item) == {"x", "shared", "nested"}
        np.testing.assert_array_equal(item["x"].numpy(), values[r])
        np.testing.assert_array_equal(item["nested"][0].numpy(), values[r])
        assert item["shared"] is shared
    # A bare per-replica value: the list of its parts.
    bare = group.local_values(pr)
    assert [b.numpy().tolist() for b in bare] == [v.tolist() for v in values]
    # distribute() is the inverse.
    again = group.distribute(bare)
    assert isinstance(again, tf.distribute.DistributedValues)
    for r, part in enumerate(strategy.experimental_local_results(again)):
        np.testing.assert_array_equal(part.numpy(), values[r])
    # ... and the parts of the distributed value are what each replica sees in strategy.run.
    out = strategy.run(lambda v: v * 2.0, args=(again,))
    for r, part in enumerate(strategy.experimental_local_results(out)):
        np.testing.assert_array_equal(part.numpy(), values[r] * 2)


def test_local_values_rejects_a_per_replica_value_of_another_replica_count():
    _, group = make_group(2)
    other = mirrored_strategy(3)
    value = other.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(float(tf.get_static_value(ctx.replica_id_in_sync_group))))
    with pytest.raises(ValueError, match="3 values.*2 replicas"):
        group.local_values(value)


def test_calling_replicas_outside_and_inside_strategy_run():
    strategy, group = make_group(2)
    every = list(zip(group.local_replica_ids, group.local_devices))
    assert group.calling_replicas() == every
    assert [r for r, _ in every] == [0, 1]
    with strategy.scope():
        assert group.calling_replicas() == every
    seen = []

    def replica_fn():
        seen.append(group.calling_replicas())
        return tf.constant(0)

    tf.function(lambda: strategy.run(replica_fn))()
    assert sorted(seen) == [[every[0]], [every[1]]]
    seen.clear()
    strategy.run(replica_fn)      # eagerly too
    assert sorted(seen) == [[every[0]], [every[1]]]


def test_device_of():
    strategy, group = make_group(2)
    assert group.device_of(1) == group.local_devices[1] == strategy.extended.worker_devices[1]
    with pytest.raises(ValueError, match=r"replica 2 does not run in this process"):
        group.device_of(2)


# ---------------------------------------------------------------------- strategies and groups
def test_strategy_replicas_of_the_default_strategy_is_one_replica():
    replicas = collectives.strategy_replicas(tf.distribute.get_strategy())
    assert replicas == collectives.StrategyReplicas(
        num_replicas=1, local_replica_ids=(0,), local_devices=(None,), num_workers=1,
        worker_index=0, worker_addresses=("localhost",))
    group = collectives.ReplicaGroup(tf.distribute.get_strategy())
    assert group.num_replicas == 1 and not group.is_multi_worker
    assert group.calling_replicas() == [(0, None)]


def test_strategy_replicas_of_mirrored_and_one_device_strategies():
    strategy = mirrored_strategy(2)
    replicas = collectives.strategy_replicas(strategy)
    assert replicas.num_replicas == 2
    assert replicas.local_replica_ids == (0, 1)
    assert replicas.local_devices == tuple(strategy.extended.worker_devices)
    assert (replicas.num_workers, replicas.worker_index) == (1, 0)
    require_replicas(2)
    one = tf.distribute.OneDeviceStrategy("/cpu:1")
    replicas = collectives.strategy_replicas(one)
    assert replicas.num_replicas == 1 and replicas.local_replica_ids == (0,)
    assert replicas.local_devices == tuple(one.extended.worker_devices)
    group = collectives.ReplicaGroup(strategy, timeout_seconds=3)
    assert group.timeout_seconds == 3.0 and isinstance(group.timeout_seconds, float)
    assert group.strategy is strategy and not group.is_multi_worker


def test_strategy_replicas_rejects_central_storage_strategy():
    require_replicas(2)
    try:
        strategy = tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
    except Exception as e:  # pylint: disable=broad-except
        pytest.skip(f"CentralStorageStrategy is not constructible here: {e}")
    with pytest.raises(ValueError, match="CentralStorageStrategy.*supported strategies"):
        collectives.strategy_replicas(strategy)
    with pytest.raises(ValueError, match="CentralStorageStrategy"):
        collectives.ReplicaGroup(strategy)


def test_group_keys_per_device_set_and_fresh_instance_keys():
    _, group2 = make_group(2)
    _, same_devices = make_group(2)
    assert group2.group_key() == same_devices.group_key()
    require_replicas(3)
    _, group3 = make_group(3)
    assert group3.group_key() != group2.group_key()
    # Every replica takes the same number of keys: the groups live on in this process, and a
    # replica left behind would wait for another instance than its peers in later collectives.
    keys = {r: [group2.next_instance_key(r), same_devices.next_instance_key(r),
                group2.next_instance_key(r)] for r in (0, 1)}
    for replica_keys in keys.values():     # shared by the groups of one key, never reused
        assert replica_keys == sorted(set(replica_keys)) and replica_keys[0] >= 1
