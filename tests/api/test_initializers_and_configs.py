"""Table initialization and config handling: seeded initializers give the same logical tables on
any replica count, `shard_info` initializers are evaluated one chunk of rows at a time, and the
user's config objects are never mutated.
"""
import copy

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.api.parity_helpers import (E, FEATURES, Trainer, make_optimizer, make_strategy,
                                      random_steps, skip_without_devices, table_configs)


@pytest.mark.parametrize("make_initializer", [
    lambda: tf.keras.initializers.RandomUniform(-0.3, 0.3, seed=7),
    lambda: tf.keras.initializers.TruncatedNormal(stddev=0.2, seed=11),
    lambda: tf.random_normal_initializer(stddev=0.1, seed=3),
], ids=["keras_random_uniform", "keras_truncated_normal", "tf_random_normal"])
def test_seeded_initializer_gives_same_logical_tables_on_any_replica_count(make_initializer):
    skip_without_devices(8)
    results = {}
    for replicas in (1, 2, 4, 8):
        strategy = make_strategy(replicas)
        tables = [E.TableConfig(vocabulary_size=v, dim=d, initializer=make_initializer(),
                                combiner="sum", name=f"t{i}")
                  for i, (v, d) in enumerate([(37, 5), (100, 8), (9, 3)])]
        config = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
        with strategy.scope():
            embedding = sce.TPUEmbeddingV2(config, make_optimizer("ftrl"))
            embedding.build(per_replica_batch_size=4)
        results[replicas] = (
            {c.name: v for c, v in embedding.embedding_tables.items()},
            {c.name: {s: embedding.logical_slot(c, s) for s in ("accumulators", "linears")}
             for c in tables})
    base_tables, base_slots = results[1]
    for name, value in base_tables.items():
        assert np.abs(value).max() > 0
        # Slot initial values (docs/optimizers.md#slots): FTRL accumulators start at initial_accumulator_value.
        np.testing.assert_array_equal(base_slots[name]["accumulators"],
                                      np.full(value.shape, np.float32(0.1)))
        np.testing.assert_array_equal(base_slots[name]["linears"], np.zeros(value.shape))
    for replicas, (tables, slots) in results.items():
        for name, value in base_tables.items():
            np.testing.assert_array_equal(tables[name], value,
                                          err_msg=f"{name} on {replicas} replicas")
            for s in ("accumulators", "linears"):
                np.testing.assert_array_equal(slots[name][s], base_slots[name][s])


def test_shard_info_initializer_is_evaluated_one_chunk_of_rows_at_a_time(monkeypatch):
    """An initializer that accepts `shard_info` is called per chunk of logical rows (never at
    the whole shape), and the chunks land at their logical rows on every replica count."""
    skip_without_devices(4)
    from tf_sc_embedding.tables import table_storage  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(table_storage, "LOGICAL_CHUNK_ROWS", 16)
    vocab, dim = 70, 3
    expected = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim) / 100.0

    class RowIndexInitializer:  # value = logical position, computed from the chunk's offset
        def __init__(self):
            self.calls = []

        def __call__(self, shape, dtype=None, shard_info=None):
            self.calls.append((tuple(shard_info.shape), tuple(shard_info.offset)))
            first, rows = shard_info.offset[0], shard_info.shape[0]
            return tf.constant(expected[first:first + rows])

    for replicas in (1, 4):
        initializer = RowIndexInitializer()
        table = E.TableConfig(vocabulary_size=vocab, dim=dim, initializer=initializer,
                              combiner="sum", name="t")
        with make_strategy(replicas).scope():
            embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)},
                                           make_optimizer("sgd"), replication_threshold_bytes=0)
            embedding.build(per_replica_batch_size=4)
        assert initializer.calls == [((16, dim), (0, 0)), ((16, dim), (16, 0)),
                                     ((16, dim), (32, 0)), ((16, dim), (48, 0)),
                                     ((6, dim), (64, 0))]
        np.testing.assert_array_equal(embedding.logical_tables()["t"], expected)


def _config_state(obj):
    """A comparable snapshot of a config object's attributes (nested configs by identity)."""
    return {k: (id(v), repr(v)) for k, v in vars(obj).items()}


def test_user_configs_are_not_mutated():
    optimizer = make_optimizer("adam", clip_weight_min=-1.0)
    tables = table_configs("mean", optimizers={"small": make_optimizer("ftrl")})
    objects = list(tables.values()) + [t.optimizer for t in tables.values() if t.optimizer]
    objects.append(optimizer)
    snapshot = copy.deepcopy([_config_state(o) for o in objects])
    trainer = Trainer(2, optimizer, "mean", "ragged", tables=tables)
    feature_snapshot = copy.deepcopy([_config_state(f) for f in tf.nest.flatten(trainer.config)])
    for feats, targets in random_steps(0, "mean", "ragged", True, 2, steps=2):
        trainer.step(feats, targets)
    trainer.logical_tables(), trainer.logical_slots()
    assert [_config_state(o) for o in objects] == snapshot
    assert [_config_state(f) for f in tf.nest.flatten(trainer.config)] == feature_snapshot
    for feature in tf.nest.flatten(trainer.config):
        assert not feature.output_shape.rank  # the library must not fill it in
    assert all(trainer.config[k].table is tables[t] for k, t in FEATURES)
