"""Clear errors of `tf_sc_embedding.TPUEmbeddingV2`: bad configs, bad inputs, bad ids, and a
failing step must leave every table and slot exactly as it was."""
import copy
import types

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tf_sc_embedding.collectives import replica_group as collectives
from tests.api.parity_helpers import (FEATURES, TABLES, Trainer, loss_of,
                                      make_optimizer, random_steps, skip_without_devices)

E = tf.tpu.experimental.embedding


def small_embedding(optimizer=None, vocab=16, build=True, **table_kwargs):
    table = E.TableConfig(vocabulary_size=vocab, dim=4, name="t",
                          initializer=tf.constant_initializer(
                              np.arange(vocab * 4, dtype=np.float32).reshape(vocab, 4) / 64),
                          **{"combiner": "sum", **table_kwargs})
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)},
                                   E.SGD(0.1) if optimizer is None else optimizer)
    if build:
        embedding.build(per_replica_batch_size=4)
    return embedding


IDS = {"f": tf.constant([1, 2, 3, 4])}


# --------------------------------------------------------------------------------------------
# Structures and input types
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("features", [
    {"g": tf.constant([1, 2, 3, 4])},
    {"f": tf.constant([1, 2, 3, 4]), "g": tf.constant([1, 2, 3, 4])},
    [tf.constant([1, 2, 3, 4])],
    {"f": [1, 2, 3, 4]},
], ids=["wrong_key", "extra_key", "list_not_dict", "python_list_leaf"])
def test_feature_structure_mismatch(features):
    embedding = small_embedding()
    with pytest.raises((ValueError, TypeError), match="features must have the same structure"):
        embedding.embedding_lookup(features)
    with pytest.raises((ValueError, TypeError), match="features must have the same structure"):
        embedding.enqueue(features)


def test_weights_structure_mismatch():
    embedding = small_embedding()
    with pytest.raises(ValueError, match="weights must have the same structure"):
        embedding.embedding_lookup(IDS, {"g": tf.ones([4])})


def test_gradients_structure_mismatch():
    embedding = small_embedding()
    activations, preserved = embedding.embedding_lookup(IDS)
    with pytest.raises(ValueError, match="gradients must have the same structure"):
        embedding.apply_gradients({"g": activations["f"]}, preserved)


def test_features_none_is_rejected():
    with pytest.raises(ValueError, match="features contains None"):
        small_embedding().embedding_lookup({"f": None})


@pytest.mark.parametrize("ids,match", [
    (tf.constant([1.0, 2.0, 3.0, 4.0]), "feature 'f': ids must be int32 or int64, got float32"),
    (tf.constant(["a", "b", "c", "d"]), "feature 'f': ids must be int32 or int64, got string"),
    (5, "feature 'f': expected a tf.Tensor, tf.SparseTensor or tf.RaggedTensor, got int"),
    (tf.ragged.constant([[[1]], [[2]], [[3]], [[4]]]),
     r"feature 'f': ragged ids must have shape \[batch, None\]"),
    (tf.sparse.from_dense(tf.ones([4, 2, 2], tf.int64)),
     "feature 'f': sparse ids must have rank 2"),
], ids=["float", "string", "python_int", "ragged_rank_2", "sparse_rank_3"])
def test_wrong_input_types(ids, match):
    with pytest.raises(ValueError, match=match):
        small_embedding().embedding_lookup({"f": ids})


@pytest.mark.parametrize("ids,weights", [
    (tf.ragged.constant([[1], [2], [3], [4]]), tf.ones([4])),
    (tf.constant([1, 2, 3, 4]), tf.ragged.constant([[1.0], [1.0], [1.0], [1.0]])),
    (tf.sparse.from_dense(tf.constant([[1], [2], [3], [4]])), tf.ones([4, 1])),
], ids=["ragged_ids_dense_weights", "dense_ids_ragged_weights", "sparse_ids_dense_weights"])
def test_weights_of_another_kind(ids, weights):
    with pytest.raises(ValueError, match=r"feature 'f': weights must have the same kind"):
        small_embedding().embedding_lookup({"f": ids}, {"f": weights})


@pytest.mark.parametrize("ids,match", [
    (tf.constant([1, 2, 3, 4, 5, 6, 7, 8]), "dense input has 8 ids but sample_count is 4"),
    (tf.ragged.constant([[1], [2]]), "row_splits has 3 elements but sample_count"),
], ids=["dense", "ragged"])
def test_batch_size_other_than_built(ids, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        small_embedding().embedding_lookup({"f": ids})


def test_weights_count_mismatch():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="feature 'f': weights has 3 elements but values has 4"):
        small_embedding().embedding_lookup(IDS, {"f": tf.ones([3])})


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

def test_apply_gradients_before_build():
    embedding = small_embedding(build=False)
    with pytest.raises(RuntimeError, match="before the tables were built"):
        embedding.apply_gradients({"f": tf.ones([4, 4])}, {})


@pytest.mark.parametrize("what", ["embedding_tables", "variables", "embedding_layouts",
                                  "embedding_table_shards"])
def test_properties_before_build(what):
    with pytest.raises(RuntimeError, match="call build"):
        getattr(small_embedding(build=False), what)


def test_dequeue_before_build():
    with pytest.raises(RuntimeError, match="call build"):
        small_embedding(build=False).dequeue({})


def test_dequeue_of_unpacked_ids_with_one_replica():
    """One replica's enqueue packs the CSR buffers; dequeue given the sorted ids alone (what
    enqueue returns with several replicas) names the stacked table instead of failing in a
    kernel."""
    from tf_sc_embedding.preprocessing import enqueue   # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.tables.layout import EmbeddingLayout   # pylint: disable=import-outside-toplevel
    embedding = small_embedding()
    packed = embedding.enqueue(IDS)
    [name] = packed
    layout = EmbeddingLayout(embedding.feature_config, E.SGD(0.1), 1, 4, {"f": (4,)})
    unpacked = enqueue.preprocess(layout, [IDS["f"]], [None])
    with pytest.raises(ValueError, match=f"stacked table '{name}': dequeue takes what enqueue "
                                         "of this embedding returned \\(PackedCsr\\), got "
                                         "PreprocessedTable"):
        embedding.dequeue(unpacked)
    activations, _ = embedding.dequeue(packed)   # the embedding still works
    np.testing.assert_array_equal(activations["f"].numpy(),
                                  embedding.embedding_lookup(IDS)[0]["f"].numpy())


@pytest.mark.parametrize("batch", [6, 2, 1])
def test_per_replica_batch_not_divisible_by_sparse_cores(batch):
    embedding = small_embedding(build=False)
    with pytest.raises(ValueError, match=rf"per-replica batch \({batch} samples\) must be "
                                         r"divisible by the SparseCores per replica \(4\)"):
        embedding.build(per_replica_batch_size=batch)
    assert not embedding.built


def test_per_replica_batch_not_divisible_with_replicas():
    skip_without_devices(2)
    tf.distribute.MirroredStrategy._collective_key_base += 100000
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        embedding = small_embedding(build=False)
        with pytest.raises(ValueError, match=r"replicas x SparseCores \(2 x 4\)"):
            embedding.build(per_replica_batch_size=2)


def test_build_without_batch_size():
    embedding = small_embedding(build=False)
    with pytest.raises(ValueError, match="pass per_replica_batch_size"):
        embedding.build()


def test_three_replicas_are_rejected_at_construction():
    # 3 x 4 SparseCores cannot hold TensorFlow's power-of-two layout: rejected before any
    # variable exists, not by the preprocessing ops at the first step.
    skip_without_devices(3)
    tf.distribute.MirroredStrategy._collective_key_base += 100000
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    initial = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t", combiner="sum",
                          initializer=tf.constant_initializer(initial))
    with strategy.scope():
        with pytest.raises(ValueError, match=r"3 replica\(s\) x sparse_cores_per_replica=4 = "
                                             r"12 SparseCores: .*power-of-two"):
            sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(0.1),
                               table_placement={"t": "sharded"})
        # A replicated table is laid out for one replica: any replica count works.
        embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(0.1),
                                       table_placement={"t": "replicated"})
    embedding.build(per_replica_batch_size=4)

    @tf.function
    def step(ids):
        def fn(ids):
            activations, preserved = embedding(ids)
            embedding.apply_gradients(activations, preserved)
            return activations["f"]
        return strategy.run(fn, args=(ids,))
    step(IDS)
    # Each of the three replicas looked up rows 1-4 and sends them back as gradients: SGD(0.1)
    # applies their sum, 3 x the row.
    want = initial.copy()
    want[1:5] *= 1 - 0.1 * 3
    np.testing.assert_allclose(
        embedding.embedding_tables[embedding.feature_config["f"].table], want, rtol=1e-6)


@pytest.mark.parametrize("count,match", [
    (3, r"1 replica\(s\) x sparse_cores_per_replica=3 = 3 SparseCores"),
    (0, "sparse_cores_per_replica must be a positive integer, got 0"),
    ("4", "sparse_cores_per_replica must be a positive integer, got '4'"),
    (2.0, "sparse_cores_per_replica must be a positive integer, got 2.0"),
    (True, "sparse_cores_per_replica must be a positive integer, got True"),
])
def test_bad_sparse_cores_per_replica(count, match):
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    with pytest.raises(ValueError, match=match):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(0.1),
                           sparse_cores_per_replica=count)
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(0.1),
                                   sparse_cores_per_replica=np.int64(2))
    embedding.build(per_replica_batch_size=4)
    assert embedding({"f": tf.constant([1, 2, 3, 4])})[0]["f"].shape == (4, 4)


def test_compute_sparse_core_stats_rejects_three_chips():
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    with pytest.raises(ValueError, match="power-of-two"):
        sce.TPUEmbeddingV2.compute_sparse_core_stats(
            {"f": tf.constant([1, 2, 3, 4])}, {"f": E.FeatureConfig(table=table)}, 3,
            num_sc_per_chip=4)


def _two_replica_embedding():
    skip_without_devices(2)
    tf.distribute.MirroredStrategy._collective_key_base += 100000
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        embedding = small_embedding()
    return strategy, embedding


def test_multi_replica_lookup_in_cross_replica_context():
    strategy, embedding = _two_replica_embedding()
    with strategy.scope():
        with pytest.raises(RuntimeError, match="strategy.run"):
            embedding.embedding_lookup(IDS)
        activations, preserved = strategy.run(embedding.embedding_lookup, args=(IDS,))
        with pytest.raises(RuntimeError, match="strategy.run"):
            embedding.apply_gradients({"f": tf.ones([4, 4])}, preserved)


def test_multi_replica_lookup_outside_strategy_scope():
    _, embedding = _two_replica_embedding()
    with pytest.raises(RuntimeError, match="strategy.run"):
        embedding.embedding_lookup(IDS)


# --------------------------------------------------------------------------------------------
# Optimizer and table configs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", [
    lambda: E.SGD(0.1, weight_decay_factor=0.1),
    lambda: E.Adam(0.1, weight_decay_factor=0.01,
                   multiply_weight_decay_factor_by_learning_rate=True),
], ids=["sgd", "adam"])
def test_weight_decay_is_not_implemented(optimizer):
    with pytest.raises(NotImplementedError, match="table 't': weight_decay_factor"):
        small_embedding(optimizer(), build=False)


@pytest.mark.parametrize("optimizer", [
    lambda: E.Adagrad(0.1, clipvalue=1.0),
    lambda: E.FTRL(0.1, clipvalue=(-1.0, 2.0)),
], ids=["adagrad", "ftrl"])
def test_clipvalue_is_not_implemented(optimizer):
    with pytest.raises(NotImplementedError, match="table 't': clipvalue"):
        small_embedding(optimizer(), build=False)


def _with(optimizer, **attributes):
    """TF validates most hyperparameters itself; set bad values after construction to reach the
    library's own validation."""
    for k, v in attributes.items():
        setattr(optimizer, k, v)
    return optimizer


@pytest.mark.parametrize("optimizer,match", [
    (lambda: _with(E.Adagrad(0.1), initial_accumulator_value=0.0),
     "Adagrad: initial_accumulator_value must be > 0"),
    (lambda: _with(E.Adagrad(0.1), initial_accumulator_value=-1.0),
     "Adagrad: initial_accumulator_value must be > 0"),
    (lambda: _with(E.FTRL(0.1), initial_accumulator_value=0.0),
     "FTRL: initial_accumulator_value must be > 0"),
    (lambda: _with(E.AdagradMomentum(0.1), epsilon=0.0), "AdagradMomentum: epsilon must be > 0"),
    (lambda: _with(E.AdagradMomentum(0.1), exponent=-2.0),
     "AdagradMomentum: exponent must be > 0"),
    (lambda: _with(E.Adam(0.1), beta_1=1.0), "Adam: beta_1 and beta_2 must be in"),
    (lambda: _with(E.Adam(0.1), beta_2=-0.1), "Adam: beta_1 and beta_2 must be in"),
    (lambda: _with(E.Adam(0.1), epsilon=0.0), "Adam: epsilon must be > 0"),
], ids=["adagrad_zero_accumulator", "adagrad_negative_accumulator", "ftrl_zero_accumulator",
        "adagrad_momentum_epsilon", "adagrad_momentum_exponent", "adam_beta_1", "adam_beta_2",
        "adam_epsilon"])
def test_bad_hyperparameters(optimizer, match):
    with pytest.raises(ValueError, match=match):
        small_embedding(optimizer(), build=False)


def test_bad_hyperparameters_rejected_by_tensorflow_configs():
    """What TF's own config classes already reject (so users see the same errors)."""
    with pytest.raises(ValueError):
        E.Adagrad(0.1, initial_accumulator_value=0.0)
    with pytest.raises(ValueError):
        E.Adam(0.1, beta_1=1.0)


@pytest.mark.parametrize("optimizer", [
    lambda: tf.keras.optimizers.SGD(0.1),
    lambda: E.CustomOptimizer(lambda *args: args[1], learning_rate=0.1),
    lambda: "sgd",
], ids=["keras_sgd", "custom_optimizer", "string"])
def test_unsupported_optimizer_class(optimizer):
    with pytest.raises(ValueError, match="table 't': unsupported optimizer"):
        small_embedding(optimizer(), build=False)


def test_table_without_optimizer_and_no_global_optimizer():
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    with_optimizer = E.TableConfig(vocabulary_size=16, dim=4, name="u", optimizer=E.SGD(0.1))
    config = {"f": E.FeatureConfig(table=with_optimizer), "g": E.FeatureConfig(table=table)}
    with pytest.raises(ValueError, match="table 't' has no optimizer and no global optimizer"):
        sce.TPUEmbeddingV2(config)
    # Every table has its own optimizer: no global optimizer needed.
    sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=with_optimizer)})


def test_other_config_errors():
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    with pytest.raises(ValueError, match="table names must be unique"):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table),
                            "g": E.FeatureConfig(table=E.TableConfig(16, 4, name="t"))},
                           E.SGD(0.1))
    with pytest.raises(ValueError, match="feature 'f': expected a tf.tpu.experimental.embedding"):
        sce.TPUEmbeddingV2({"f": table}, E.SGD(0.1))
    # TableConfig validates combiners itself; one set afterwards reaches the library's check.
    bad = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    bad.combiner = "max"
    with pytest.raises(ValueError, match="table 't': combiner must be"):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=bad)}, E.SGD(0.1))


# --------------------------------------------------------------------------------------------
# Bad ids: the error names feature and table; nothing changes
# --------------------------------------------------------------------------------------------

def _state(trainer):
    return trainer.logical_tables(), trainer.logical_slots()


def _assert_state_unchanged(before, after):
    for name, value in before[0].items():
        np.testing.assert_array_equal(after[0][name], value, err_msg=f"table {name} changed")
    for name, slots in before[1].items():
        for s, value in slots.items():
            np.testing.assert_array_equal(after[1][name][s], value,
                                          err_msg=f"slot {s} of {name} changed")


def _with_bad_id(feats, key, sample, bad_id):
    feats = copy.deepcopy(feats)
    f = feats[key]
    f.ids[sample] = f.ids[sample] + [bad_id]
    if f.weights is not None:
        f.weights[sample] = f.weights[sample] + [1.0]
    return feats


def _train_one_good_step(trainer, seed=0):
    feats, targets = random_steps(seed, "sum", trainer.kind, True, trainer.n, steps=1)[0]
    trainer.step(feats, targets)


@pytest.mark.parametrize("replicas,use_function,key,sample,bad_id,table", [
    ("none", False, "c", 5, 11, "wide"),       # eager, one past the end
    ("none", False, "a2", 0, -1, "big"),       # eager, negative
    (2, True, "c", 15, 11, "wide"),            # replica 1 only, separate stacked table
    (2, True, "a1", 3, 40, "big"),             # replica 0 only, stacked with 'small'
    (4, True, "b", 30, -3, "small"),           # replica 3, negative
], ids=["eager-past_end", "eager-negative", "2_replicas-replica_1", "2_replicas-replica_0",
        "4_replicas-negative"])
def test_out_of_range_ids_fail_and_change_nothing(replicas, use_function, key, sample, bad_id,
                                                  table):
    trainer = Trainer(replicas, make_optimizer("adam"), "sum", "ragged",
                      use_function=use_function)
    _train_one_good_step(trainer)  # non-trivial slots
    feats, targets = random_steps(1, "sum", "ragged", True, trainer.n, steps=1)[0]
    before = _state(trainer)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        trainer.step(_with_bad_id(feats, key, sample, bad_id), targets)
    vocab = {t.name: t.vocab for t in TABLES}[table]
    assert (f"table '{table}', feature '{key}': id {bad_id} at position"
            in str(error.value)), str(error.value)
    assert f"is out of range [0, {vocab})" in str(error.value)
    _assert_state_unchanged(before, _state(trainer))
    # The embedding is still usable afterwards.
    trainer.step(feats, targets)


def test_failing_step_changes_nothing_in_other_stacked_tables_single_replica():
    trainer = Trainer("none", make_optimizer("sgd"), "sum", "dense")
    embedding = trainer.embedding
    feats, targets = random_steps(0, "sum", "dense", False, 1, steps=1)[0]
    ids, _, target_tensors = trainer.replica_inputs(feats, targets, 0)
    ids["c"] = tf.constant([0, 1, 2, 3, 4, 5, 6, 11], tf.int64)  # 11 >= vocab of 'wide'

    @tf.function
    def step(ids, targets):
        # The bad ids of 'c' only become available after a slow (stateless) computation, so
        # the race between the update of 'big_small' and the failing validation of 'c' is
        # always won by the update (without it, it is won in practice too).
        m = tf.random.stateless_uniform([400, 400], seed=[1, 2])
        for _ in range(20):
            m = tf.matmul(m, m) / 400.0
        ids = dict(ids, c=ids["c"] + tf.cast(tf.reduce_sum(m) * 0.0, tf.int64))
        activations, preserved = embedding.embedding_lookup(ids)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            loss = loss_of(activations, targets)
        embedding.apply_gradients(tape.gradient(loss, activations), preserved)
        return activations

    before = _state(trainer)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'c'"):
        step(ids, target_tensors)
    _assert_state_unchanged(before, _state(trainer))


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "function"])
def test_int64_ids_beyond_int32_range(use_function):
    embedding = small_embedding()
    lookup = tf.function(embedding.embedding_lookup) if use_function else \
        embedding.embedding_lookup
    before = embedding.embedding_tables
    for bad in (2 ** 31, 2 ** 32 + 3, 2 ** 40):
        # (graph-mode Assert messages escape the quotes: feature \\'f\\')
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"feature \\*'f\\*': int64 ids above 2\^31 - 1"):
            lookup({"f": tf.constant([1, bad, 2, 3], tf.int64)})
    for table, value in embedding.embedding_tables.items():
        np.testing.assert_array_equal(value, before[table])


def test_int64_ids_below_int32_range_fail():
    embedding = small_embedding()
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'f'"):
        embedding.embedding_lookup({"f": tf.constant([1, -(2 ** 32) + 3, 2, 3], tf.int64)})


# --------------------------------------------------------------------------------------------
# Strategies and placement
# --------------------------------------------------------------------------------------------

def _one_table_config():
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t")
    return {"f": E.FeatureConfig(table=table)}


def test_unsupported_strategy_is_rejected_naming_the_supported_ones():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy") as info:
            sce.TPUEmbeddingV2(_one_table_config(), E.SGD(0.1))
    assert "CentralStorageStrategy" in str(info.value)


def test_parameter_server_strategy_is_rejected():

    class ParameterServerStrategyV2:   # what strategy_replicas sees of a PS strategy
        num_replicas_in_sync = 1

    with pytest.raises(ValueError, match="ParameterServerStrategy.*supported strategies"):
        collectives.strategy_replicas(ParameterServerStrategyV2())


class _FakeMultiWorker(tf.distribute.MultiWorkerMirroredStrategy):
    """What strategy_replicas reads of a MultiWorkerMirroredStrategy, without starting a server."""

    def __init__(self, replicas, local_devices, cluster, task_type, task_id):  # pylint: disable=super-init-not-called
        self._fake = (replicas, list(local_devices),
                      tf.distribute.cluster_resolver.SimpleClusterResolver(
                          tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id))

    num_replicas_in_sync = property(lambda self: self._fake[0])
    extended = property(lambda self: types.SimpleNamespace(worker_devices=self._fake[1]))
    cluster_resolver = property(lambda self: self._fake[2])


_CLUSTER = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}


def test_replica_ids_follow_the_cluster_chief_first_then_workers():
    device = "/job:worker/replica:0/task:1/device:CPU:0"
    found = collectives.strategy_replicas(_FakeMultiWorker(3, [device], _CLUSTER, "worker", 1))
    assert found == collectives.StrategyReplicas(num_replicas=3, local_replica_ids=(2,),
                                                 local_devices=(device,), num_workers=3,
                                                 worker_index=2, worker_addresses=(
                                                     "127.0.0.1:1", "127.0.0.1:2",
                                                     "127.0.0.1:3"))
    chief = collectives.strategy_replicas(_FakeMultiWorker(3, ["d"], _CLUSTER, "chief", 0))
    assert chief.local_replica_ids == (0,) and chief.worker_index == 0


@pytest.mark.parametrize("replicas,devices,task,match", [
    (4, ["d"], ("worker", 0), r"4 replicas but 3 worker\(s\) x 1 local device"),
    (3, ["d0", "d1"], ("worker", 0), r"3 replicas but 3 worker\(s\) x 2 local device"),
    (3, ["d"], ("evaluator", 0), r"task \('evaluator', 0\) of the cluster runs no replica"),
])
def test_cluster_and_replica_mismatches_are_errors_not_fallbacks(replicas, devices, task, match):
    with pytest.raises(ValueError, match=match):
        collectives.strategy_replicas(_FakeMultiWorker(replicas, devices, _CLUSTER, *task))


@pytest.mark.parametrize("placement,match", [
    ({"nope": "replicated"}, "unknown tables"), ({"t": "mirrored"}, "must be 'sharded'"),
    ({3: "replicated"}, "keys must be table names or TableConfig objects, got 3"),
    ({E.TableConfig(vocabulary_size=16, dim=4, name="u"): "replicated"}, r"unknown tables \['u'\]")])
def test_bad_table_placement_names_the_table(placement, match):
    with pytest.raises(ValueError, match=match):
        sce.TPUEmbeddingV2(_one_table_config(), E.SGD(0.1), table_placement=placement)


def test_table_placement_accepts_table_configs_as_keys():
    skip_without_devices(2)
    config = _one_table_config()
    table = config["f"].table
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        embedding = sce.TPUEmbeddingV2(config, E.SGD(0.1), table_placement={table: "replicated"})
    assert embedding.placement_plan == {"t": "replicated"}


def test_placement_plan_follows_the_threshold_and_overrides():
    skip_without_devices(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    small = E.TableConfig(vocabulary_size=16, dim=4, name="small")
    large = E.TableConfig(vocabulary_size=100_000, dim=8, name="large")
    config = {"a": E.FeatureConfig(table=small), "b": E.FeatureConfig(table=large)}
    with strategy.scope():
        default = sce.TPUEmbeddingV2(config, E.SGD(0.1))
        forced = sce.TPUEmbeddingV2(config, E.SGD(0.1),
                                    table_placement={"small": "sharded", "large": "replicated"})
        threshold = sce.TPUEmbeddingV2(config, E.SGD(0.1), replication_threshold_bytes=1024)
    # TensorFlow's layout by default: every table sharded; replication only when asked for.
    assert default.placement_plan == {"small": "sharded", "large": "sharded"}
    assert forced.placement_plan == {"small": "sharded", "large": "replicated"}
    assert threshold.placement_plan == {"small": "replicated", "large": "sharded"}
    # One replica: nothing to replicate.
    assert sce.TPUEmbeddingV2(config, E.SGD(0.1)).placement_plan == {
        "small": "sharded", "large": "sharded"}


# --------------------------------------------------------------------------------------------
# A failing step never breaks the next one
# --------------------------------------------------------------------------------------------

def _with_nan_target(targets, key, sample):
    targets = {k: np.array(v) for k, v in targets.items()}
    targets[key][sample, 0] = np.nan   # dA of that sample = LOSS_SCALE * a + target: NaN
    return targets


@pytest.mark.parametrize("replicas,key,sample,replicated", [
    ("none", "b", 5, ()),
    (2, "c", 8 + 3, ()),          # replica 1 only: replica 0 must not update anything either
    (2, "a1", 2, ()),             # replica 0 only, a table stacked with another feature's
    (2, "b", 8 + 1, ("small",)),  # a replicated table (sparse allreduce path)
    (4, "c", 3 * 8 + 7, ()),
], ids=["single", "2_replicas-replica_1", "2_replicas-stacked", "2_replicas-replicated",
        "4_replicas"])
def test_non_finite_gradient_fails_naming_the_feature_and_changes_nothing(replicas, key, sample,
                                                                          replicated):
    trainer = Trainer(replicas, make_optimizer("adagrad"), "sum", "ragged", replicated=replicated)
    _train_one_good_step(trainer)
    feats, targets = random_steps(1, "sum", "ragged", True, trainer.n, steps=1)[0]
    before = _state(trainer)
    table = dict(FEATURES)[key]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"feature '{key}' \\(table '{table}'\\): the gradient of the "
                             "activations has NaN or Inf values"):
        trainer.step(feats, _with_nan_target(targets, key, sample))
    _assert_state_unchanged(before, _state(trainer))
    trainer.step(feats, targets)   # the next step works and trains
    assert not np.array_equal(_state(trainer)[0][table], before[0][table])


def test_non_finite_gradients_of_several_features_are_all_named():
    trainer = Trainer(2, make_optimizer("sgd"), "sum", "ragged")
    feats, targets = random_steps(1, "sum", "ragged", True, trainer.n, steps=1)[0]
    bad = _with_nan_target(_with_nan_target(targets, "a2", 0), "c", 12)
    bad["c"][12, 1] = np.inf
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        trainer.step(feats, bad)
    message = str(error.value)
    assert "feature 'a2' (table 'big'), feature 'c' (table 'wide')" in message, message
    assert "stopped before any table or optimizer slot was written" in message


@pytest.mark.parametrize("replicas,exchange", [("none", "auto"), (2, "all_to_all"),
                                               pytest.param(2, "all_gather",
                                                            marks=pytest.mark.slow)])
def test_skip_non_finite_gradients_leaves_their_rows_and_counts_them(replicas, exchange):
    """Rows touched by the bad sample keep table and slots; every other row trains as usual."""
    key, sample = "a2", 3
    kwargs = dict(replicated=("wide",)) if replicas != "none" else {}
    if exchange == "all_gather":
        kwargs["exchange"] = "all_gather"
    skipping = Trainer(replicas, make_optimizer("adagrad"), "sum", "ragged",
                       non_finite_gradients="skip", **kwargs)
    reference = Trainer(replicas, make_optimizer("adagrad"), "sum", "ragged", **kwargs)
    feats, targets = random_steps(2, "sum", "ragged", True, skipping.n, steps=1)[0]
    # Also a bad sample in the replicated table: its rows are skipped on every replica.
    bad_samples = {key: sample, "c": skipping.n * 8 - 1}
    bad = targets
    for k, s in bad_samples.items():
        bad = _with_nan_target(bad, k, s)
    before = _state(skipping)
    skipping.step(feats, bad)
    reference.step(feats, targets)
    after, expected = _state(skipping), _state(reference)
    skipped = 0
    for k, s in bad_samples.items():
        table = dict(FEATURES)[k]
        rows = sorted(set(int(i) for i in feats[k].ids[s]))
        skipped += len(rows)
        for name, state in (("table", (after[0], before[0])),):
            np.testing.assert_array_equal(state[0][table][rows], state[1][table][rows])
        for slot, value in after[1][table].items():
            np.testing.assert_array_equal(value[rows], before[1][table][slot][rows])
            other = np.setdiff1d(np.arange(value.shape[0]), rows)
            np.testing.assert_allclose(value[other], expected[1][table][slot][other],
                                       rtol=1e-5, atol=1e-6)
        other = np.setdiff1d(np.arange(after[0][table].shape[0]), rows)
        np.testing.assert_allclose(after[0][table][other], expected[0][table][other],
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after[0]["small"], expected[0]["small"], rtol=1e-5, atol=1e-6)
    assert skipping.embedding.counters().skipped_gradient_rows == skipped
    skipping.step(feats, bad)
    assert skipping.embedding.counters().skipped_gradient_rows == 2 * skipped


def test_non_finite_gradients_option_is_validated():
    with pytest.raises(ValueError, match="non_finite_gradients must be one of"):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=E.TableConfig(8, 4, name="t"))},
                           E.SGD(0.1), non_finite_gradients="ignore")


def test_malformed_preserved_outputs_fail_before_any_collective_and_next_step_works():
    strategy, embedding = _two_replica_embedding()
    ids = {"f": tf.constant([1, 2, 3, 4])}

    @tf.function
    def step(bad):
        def replica_step():
            activations, preserved = embedding.embedding_lookup(ids)
            embedding.apply_gradients({"f": tf.ones_like(activations["f"])},
                                      {"t": preserved} if bad else preserved)
            return activations["f"]
        return strategy.run(replica_step)

    with pytest.raises(ValueError, match="preserved_outputs must be"):
        step(True)
    step(False)
    step(False)
