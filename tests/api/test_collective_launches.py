"""How many collectives one training step launches (docs/multi_worker.md#exchange).

A launch costs about 1 ms of wall time between two processes on loopback, whatever its size
(BENCHMARKS.md, "Collective launches"), so the all-to-all step launches a fixed number per step
for all stacked tables together, never one per table: forward, one all-gather of the counts (on
TensorFlow's transport; on oneCCL they ride with the ids, tests/api/test_counts_riding.py) and
two all-to-alls (ids out, rows back); backward, one all-to-all of the gradient rows, which also
carries every replica's non-finite gradient marks. Replicated tables add two phases of two
collectives each.
Counted in the traced step's graph, per replica, under MirroredStrategy.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf

from tests.devices import mirrored_strategy, require_replicas
import tf_sc_embedding as sce

E = tf.tpu.experimental.embedding
BATCH = 8


def feature_config(num_tables, dims):
    tables = [E.TableConfig(vocabulary_size=1000 + 100 * i, dim=dims[i % len(dims)], name=f"t{i}")
              for i in range(num_tables)]
    return {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}


def launches_per_replica(replicas, config, **kwargs):
    """{collective op type: count} of one replica's step (embedding call + apply_gradients)."""
    strategy = mirrored_strategy(replicas)
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(config, E.Adagrad(0.1), **kwargs)
    embedding.build(per_replica_batch_size=BATCH)
    rng = np.random.default_rng(0)
    ids = {name: tf.constant(rng.integers(0, 1000, BATCH), tf.int32) for name in config}

    @tf.function
    def step(ids):
        def replica_step(ids):
            activations, preserved = embedding(ids)
            embedding.apply_gradients(activations, preserved)
        strategy.run(replica_step, args=(ids,))

    graph = step.get_concrete_function(ids).graph
    counts = collections.Counter(op.type for op in graph.get_operations()
                                 if op.type.startswith("Collective"))
    assert all(n % replicas == 0 for n in counts.values()), counts
    return {kind: n // replicas for kind, n in counts.items()}, embedding


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("num_tables,dims", [pytest.param(1, [8], marks=pytest.mark.slow),
                                             (6, [8, 16, 8])])
def test_sharded_step_launches_four_collectives_whatever_the_tables(replicas, num_tables, dims):
    require_replicas(replicas)
    counts, embedding = launches_per_replica(replicas, feature_config(num_tables, dims),
                                             replication_threshold_bytes=0)
    if num_tables > 1:
        assert len({t.stacked_table_name
                    for t in embedding.embedding_layouts.values()}) > 1   # several stacked tables
    assert counts == {"CollectiveGatherV2": 1, "CollectiveAllToAllV2": 3}


@pytest.mark.parametrize("mode", ["error", "skip"])
def test_all_gather_exchange_agrees_on_non_finite_gradients_with_one_gather(mode):
    # The all-gather exchange has no gradient all-to-all to carry the marks: with "error" they
    # take one small all-gather of their own; "skip" needs no agreement.
    require_replicas(2)
    counts, _ = launches_per_replica(2, feature_config(3, [8]), replication_threshold_bytes=0,
                                     exchange="all_gather", non_finite_gradients=mode)
    baseline, _ = launches_per_replica(2, feature_config(3, [8]), replication_threshold_bytes=0,
                                       exchange="all_gather", non_finite_gradients="skip")
    extra = 1 if mode == "error" else 0
    assert counts["CollectiveGatherV2"] == baseline["CollectiveGatherV2"] + extra


def test_replicated_tables_add_two_phases_of_two_collectives():
    require_replicas(2)
    config = feature_config(4, [8])
    counts, embedding = launches_per_replica(
        2, config, table_placement={"t0": "replicated", "t1": "replicated", "t2": "sharded",
                                    "t3": "sharded"})
    assert sorted(p for p in embedding.placement_plan.values()) == [
        "replicated", "replicated", "sharded", "sharded"]
    # phase 1: counts (all-gather) + ids and rows (all-to-all); phase 2: counts + ids and rows
    # (all-gather each).
    assert counts == {"CollectiveGatherV2": 1 + 3, "CollectiveAllToAllV2": 3 + 1}
