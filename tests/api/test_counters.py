"""`TPUEmbeddingV2.counters()`: every counter in one typed record (tf_sc_embedding/step/counters.py),
per open-vocabulary table where a counter is kept per table."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.devices import mirrored_strategy
from tf_sc_embedding.step.counters import EmbeddingCounters

E = tf.tpu.experimental.embedding


def make_embedding():
    fixed = E.TableConfig(vocabulary_size=16, dim=4, name="fixed")
    users = E.TableConfig(vocabulary_size=8, dim=4, name="users")
    items = E.TableConfig(vocabulary_size=8, dim=4, name="items")
    features = {"f": E.FeatureConfig(table=fixed, name="f"),
                "u": E.FeatureConfig(table=users, name="u"),
                "i": E.FeatureConfig(table=items, name="i")}
    return sce.TPUEmbeddingV2(
        features, optimizer=E.SGD(learning_rate=0.5), non_finite_gradients="skip",
        dynamic_vocabularies={"users": sce.DynamicVocabulary(admission_threshold=2),
                              "items": sce.DynamicVocabulary()})


def step(embedding, batch, gradient_value):
    activations, preserved = embedding(batch)
    gradients = {k: tf.fill(tf.shape(a), gradient_value) for k, a in activations.items()}
    return embedding.apply_gradients(gradients, preserved)


def test_counters_read_every_counter_once_per_table_where_kept():
    embedding = make_embedding()
    batch = {"f": tf.constant([[1], [2], [3], [4]], tf.int64),
             "u": tf.constant([[5], [6], [7], [8]], tf.int64),   # each seen once: not admitted
             "i": tf.constant([[3], [4], [3], [4]], tf.int64)}   # admitted at once
    step(embedding, batch, 0.25)
    first = embedding.counters()
    assert isinstance(first, EmbeddingCounters)
    assert set(first.unadmitted_ids) == set(first.refused_keys) == {"users", "items"}
    assert first.unadmitted_ids == {"users": 4, "items": 0}
    assert first.refused_keys == {"users": 0, "items": 0}
    assert first.dropped_ids == 0 and first.skipped_gradient_rows == 0
    assert first.collective_bytes_sent == first.collective_launches == {0: 0}   # no collective
    step(embedding, batch, np.float32(np.nan))
    second = embedding.counters()
    assert second.skipped_gradient_rows > 0     # the non-finite step skipped its rows
    assert second.unadmitted_ids["items"] == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.dropped_ids = 1


def test_the_facade_has_no_counter_methods_besides_counters():
    names = {n for n in dir(sce.TPUEmbeddingV2) if n.startswith("num_")}
    assert names == set() and not hasattr(sce.TPUEmbeddingV2, "collective_bytes_sent")


def test_two_replicas_count_their_launches_and_bytes_per_replica():
    strategy = mirrored_strategy(2)
    table = E.TableConfig(vocabulary_size=64, dim=4, name="t")
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table, name="f")},
                                       optimizer=E.SGD(learning_rate=0.5), exchange="all_to_all")
    embedding.build(per_replica_batch_size=4)

    @tf.function
    def train():
        def replica_step():
            activations, preserved = embedding({"f": tf.constant([[1], [2], [3], [4]],
                                                                 tf.int64)})
            return embedding.apply_gradients(activations, preserved)
        return strategy.run(replica_step)

    train()
    one = embedding.counters()
    train()
    two = embedding.counters()
    assert set(one.collective_launches) == {0, 1}
    # The all-to-all step: counts all-gathered, ids and rows forward, gradients back.
    assert one.collective_launches == {0: 4, 1: 4}
    assert two.collective_launches == {0: 8, 1: 8}
    assert all(two.collective_bytes_sent[r] == 2 * one.collective_bytes_sent[r] > 0
               for r in (0, 1))
