"""The exchanges (tf_sc_embedding/exchanges/) on their own, not through TPUEmbeddingV2's step.

Each exchange is built over the plan and storage of an embedding (its public `plan`, `storage`
and `replica_group`), then driven directly: preprocess -> lookup must give the numpy combiner of
the logical rows, and update_targets + update_inputs + one fused SGD update must subtract the
learning rate times every replica's summed gradient rows from exactly the rows looked up.
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tf_sc_embedding import exchanges
from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding.exchanges import AllGatherExchange, AllToAllExchange, ReplicatedExchange
from tests.devices import mirrored_strategy

E = tf.tpu.experimental.embedding
B = 8          # per-replica batch
LR = 0.5


def _embedding(strategy, placement, exchange="auto"):
    small = E.TableConfig(vocabulary_size=24, dim=4, name="small", combiner="sum",
                          initializer=tf.constant_initializer(np.arange(96.0).reshape(24, 4)))
    large = E.TableConfig(vocabulary_size=40, dim=8, name="large", combiner="sum",
                          initializer=tf.constant_initializer(np.arange(320.0).reshape(40, 8)))
    features = {"a": E.FeatureConfig(table=small), "b": E.FeatureConfig(table=large)}
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, E.SGD(LR), exchange=exchange,
                                       table_placement=placement)
    embedding.build(per_replica_batch_size=B)
    return embedding


def _ids(replica):
    rng = np.random.default_rng(replica)
    return {"a": tf.constant(rng.integers(0, 24, B), tf.int32),
            "b": tf.constant(rng.integers(0, 40, B), tf.int32)}


def _exchanges_of(embedding):
    return exchanges.build(embedding.plan, embedding.exchange, embedding.replica_group, None)


def _run(strategy, embedding, step):
    """Runs step(exchanges, view, ids) in every replica; returns the local results."""
    group = embedding.replica_group
    built = _exchanges_of(embedding)

    @tf.function
    def run():
        def replica_fn():
            view = collectives.ReplicaView(group)
            return step(built, view, _ids_for(view))
        return strategy.run(replica_fn)

    def _ids_for(view):
        all_ids = [_ids(r) for r in range(group.num_replicas)]
        return {k: tf.gather(tf.stack([ids[k] for ids in all_ids]), view.replica_id)
                for k in ("a", "b")}

    return [tf.nest.map_structure(np.asarray, r)
            for r in strategy.experimental_local_results(run())]


def test_choose_picks_single_all_to_all_or_all_gather():
    limits = tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(max_ids_per_table={"t": 8})
    assert exchanges.choose("auto", 1, None) == exchanges.SINGLE
    assert exchanges.choose("all_gather", 1, None) == exchanges.SINGLE
    assert exchanges.choose("auto", 2, None) == "all_to_all"
    assert exchanges.choose("auto", 2, limits) == "all_gather"
    assert exchanges.choose("all_to_all", 2, limits) == "all_to_all"


@pytest.mark.parametrize("replicas,placement,exchange,kinds", [
    (1, {}, "auto", [AllGatherExchange]),
    (2, {}, "auto", [AllToAllExchange]),
    (2, {}, "all_gather", [AllGatherExchange]),
    (2, {"small": "replicated"}, "auto", [AllToAllExchange, ReplicatedExchange]),
    (2, {"small": "replicated", "large": "replicated"}, "auto", [ReplicatedExchange]),
])
def test_build_gives_one_exchange_per_placement_sharded_first(replicas, placement, exchange,
                                                               kinds):
    embedding = _embedding(mirrored_strategy(replicas), placement, exchange)
    built = _exchanges_of(embedding)
    assert [type(e) for e in built] == kinds
    owned = [name for e in built for name in e.stacked_tables]
    assert sorted(owned) == sorted(embedding.plan.stacked_tables)   # each table exactly once


CASES = [(1, {}, "auto"), (2, {}, "auto"), (2, {}, "all_gather"),
         (2, {"small": "replicated"}, "auto")]


@pytest.mark.parametrize("replicas,placement,exchange", CASES)
def test_lookup_is_the_sum_of_the_logical_rows(replicas, placement, exchange):
    strategy = mirrored_strategy(replicas)
    embedding = _embedding(strategy, placement, exchange)
    tables = embedding.logical_tables()
    variables = embedding.variables

    def step(built, view, ids):
        preprocessed, activations = {}, {}
        for e in built:
            preprocessed.update(e.preprocess(ids, {"a": None, "b": None}))
        for e in built:
            activations.update(e.lookup(view, preprocessed, variables)[0])
        return activations

    for replica, activations in enumerate(_run(strategy, embedding, step)):
        ids = _ids(replica)
        np.testing.assert_array_equal(activations["a"], tables["small"][ids["a"].numpy()])
        np.testing.assert_array_equal(activations["b"], tables["large"][ids["b"].numpy()])


@pytest.mark.parametrize("replicas,placement,exchange", CASES)
def test_update_applies_every_replicas_gradient_to_the_rows_looked_up(replicas, placement,
                                                                       exchange):
    strategy = mirrored_strategy(replicas)
    embedding = _embedding(strategy, placement, exchange)
    before = embedding.logical_tables()
    variables = embedding.variables

    def step(built, view, ids):
        preprocessed, preserved, by_path = {}, [], {}
        for e in built:
            preprocessed.update(e.preprocess(ids, {"a": None, "b": None}))
        for e in built:
            activations, kept = e.lookup(view, preprocessed, variables)
            assert e.is_preserved(kept)
            preserved.append(kept)
            by_path.update(activations)
        gradients = {p: tf.ones_like(a) for p, a in by_path.items()}
        results = []
        for e, kept in zip(built, preserved):
            targets = e.update_targets(view.replica_id, variables)
            inputs, agreed = e.update_inputs(view, kept, e.stack_gradients(gradients))
            assert agreed is None
            results += [fused_update.run(targets[name], inputs[name]) for name in targets]
        with tf.control_dependencies(results):
            return tf.constant(0)

    _run(strategy, embedding, step)
    after = embedding.logical_tables()
    for path, name in (("a", "small"), ("b", "large")):
        counts = np.zeros(len(before[name]))
        for replica in range(replicas):
            np.add.at(counts, _ids(replica)[path].numpy(), 1.0)
        np.testing.assert_allclose(after[name], before[name] - LR * counts[:, None], rtol=1e-6)


def test_each_exchange_recognizes_only_its_own_preserved_state():
    strategy = mirrored_strategy(2)
    a2a = _exchanges_of(_embedding(strategy, {}))[0]
    gather = _exchanges_of(_embedding(strategy, {}, "all_gather"))[0]
    replicated = _exchanges_of(_embedding(strategy, {"small": "replicated",
                                                     "large": "replicated"}))[0]
    csr = {name: None for name in gather.stacked_tables}
    assert not a2a.is_preserved(csr) and not a2a.is_preserved(None)
    assert not gather.is_preserved(({}, None)) and not gather.is_preserved(csr)
    assert not replicated.is_preserved(csr)


def test_only_the_all_to_all_exchange_carries_the_non_finite_flags():
    assert AllToAllExchange.carries_flags
    assert not AllGatherExchange.carries_flags and not ReplicatedExchange.carries_flags
