"""Behaviour a TensorFlow user meets first, checked against TensorFlow itself (issue 31, item 3)."""
import os

import numpy as np
import tensorflow as tf

import tf_sc_embedding as sce
from tests.devices import mirrored_strategy

E = tf.tpu.experimental.embedding


def _trained(table, strategy=None):
    features = {"f": E.FeatureConfig(table=table)}
    with (strategy or tf.distribute.get_strategy()).scope():
        embedding = sce.TPUEmbeddingV2(features, E.Adagrad(0.1))
    embedding.build(per_replica_batch_size=4)
    return embedding, features


def test_root_checkpoint_keys_are_tensorflows_and_serving_restores_them(tmp_path):
    table = E.TableConfig(vocabulary_size=25, dim=6, name="table1",
                          initializer=tf.initializers.RandomUniform(-1, 1, seed=3))
    embedding, features = _trained(table)
    activations, preserved = embedding({"f": tf.constant([1, 2, 3, 4])})
    embedding.apply_gradients({"f": tf.ones_like(activations["f"])}, preserved)
    path = tf.train.Checkpoint(embedding).save(os.path.join(tmp_path, "ckpt"))
    keys = [name for name, _ in tf.train.list_variables(path)]
    assert "table1/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "table1.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert not any(k.startswith("/") for k in keys)
    serving = E.TPUEmbeddingForServing(features, optimizer=E.Adagrad(0.1))
    serving.build()
    tf.train.Checkpoint(serving).restore(path).expect_partial()
    np.testing.assert_array_equal(serving.embedding_tables[table].numpy(),
                                  embedding.embedding_tables[table])


def test_default_layout_shards_every_table_as_tensorflow_does():
    """2 replicas x 4 SparseCores = 8 shards: logical row r lives in shard r mod 8 at row r // 8,
    and replica 0 holds shards 0-3, so its second row is logical row 8 (TensorFlow's layout)."""
    table = E.TableConfig(vocabulary_size=25, dim=6, name="t",
                          initializer=tf.constant_initializer(np.arange(150.0).reshape(25, 6)))
    embedding, _ = _trained(table, mirrored_strategy(2))
    assert embedding.placement_plan == {"t": "sharded"}
    logical = embedding.embedding_tables[table]
    shards = [v.numpy() for v in embedding.embedding_table_shards[table]]
    np.testing.assert_array_equal(shards[0][1, :6], logical[8])
    rows_per_shard = shards[0].shape[0] // 4
    for replica, shard in enumerate(shards):
        for row in range(shard.shape[0]):
            logical_row = (row % rows_per_shard) * 8 + replica * 4 + row // rows_per_shard
            if logical_row < 25:
                np.testing.assert_array_equal(shard[row, :6], logical[logical_row])


def test_module_variable_walks_work():
    """tf.Module's trainable_variables / submodules walk the embedding (no TypeError). The tables
    are trained by the embedding's own fused optimizer, so they are not trainable variables for
    an outer optimizer: they are listed among the non-trainable variables."""
    embedding, _ = _trained(E.TableConfig(vocabulary_size=16, dim=4, name="t"))
    assert embedding.trainable_variables == ()
    shards = {id(v) for kinds in embedding.variables.values() for table in kinds.values()
              for v in table.shards}
    assert shards and shards <= {id(v) for v in embedding.non_trainable_variables}
    assert len(embedding.submodules) == len(embedding.variables["t"])   # parameters + slot
