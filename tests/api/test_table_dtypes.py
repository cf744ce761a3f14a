"""16-bit tables (`table_dtypes`): bfloat16 and float16 rows with stochastic rounding.

The rows are read into float32, updated in float32 and written back rounded with bits that are a
function of (table, logical row, column, update step) only, so runs agree bit for bit across
replica counts, exchanges and placements, and a run restored from a checkpoint continues exactly.
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.devices import mirrored_strategy, require_replicas

E = tf.tpu.experimental.embedding
B = 32
TABLES = (("big", 64, 8), ("small", 20, 8), ("wide", 12, 16))


def make(replicas, dtype, exchange="auto", replicated=(), rounding="stochastic",
         optimizer=None, build=True):
    strategy = mirrored_strategy(replicas) if replicas > 1 else tf.distribute.get_strategy()
    tables = {n: E.TableConfig(vocabulary_size=v, dim=d, name=n, combiner="sum",
                               initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5,
                                                                               seed=len(n)))
              for n, v, d in TABLES}
    features = {"a": E.FeatureConfig(table=tables["big"]),
                "b": E.FeatureConfig(table=tables["small"]),
                "c": E.FeatureConfig(table=tables["wide"])}
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(
            features, optimizer or E.Adagrad(0.1), table_dtypes={t: dtype for t in tables},
            table_rounding=rounding, exchange=exchange,
            table_placement={t: "replicated" for t in replicated})
    if build:
        embedding.build(per_replica_batch_size=B // replicas)
    return strategy, embedding


def train(strategy, embedding, steps):
    replicas = strategy.num_replicas_in_sync
    per = B // replicas

    @tf.function
    def step(ids):
        def fn(ids):
            activations, preserved = embedding(ids)
            embedding.apply_gradients(
                tf.nest.map_structure(lambda a: tf.sin(3.0 * a) + 0.25, activations), preserved)
        strategy.run(fn, args=(ids,))

    for s in steps:
        rng = np.random.default_rng(s)
        ids = {"a": rng.integers(0, 10, B), "b": rng.integers(0, 20, B),
               "c": rng.integers(0, 12, B)}
        if replicas > 1:
            ids = strategy.experimental_distribute_values_from_function(
                lambda ctx: {k: tf.constant(v[ctx.replica_id_in_sync_group * per:
                                              (ctx.replica_id_in_sync_group + 1) * per])
                             for k, v in ids.items()})
        step(ids)
    return {n: embedding.tables.read(n) for n, _, _ in TABLES}


@pytest.mark.parametrize("dtype", [tf.bfloat16, pytest.param(tf.float16, marks=pytest.mark.slow)])
def test_bit_identical_over_replica_counts_exchanges_and_placements(dtype):
    require_replicas(4)
    strategy, embedding = make(1, dtype)
    assert {v.dtype for kinds in embedding.storage.stacked_variables().values()
            for v in kinds["parameters"].shards} == {dtype}
    expected = train(strategy, embedding, range(5))
    for replicas, exchange, replicated in [(2, "auto", ()), (4, "auto", ()),
                                           (2, "all_gather", ()), (4, "auto", ("small",))]:
        got = train(*make(replicas, dtype, exchange, replicated)[:2], range(5))
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name],
                                          err_msg=f"{replicas} {exchange} {replicated} {name}")


def test_stochastic_rounding_moves_rows_by_tiny_updates_that_nearest_loses():
    """SGD steps of 1e-4 on rows near 1.0 (bfloat16 step 2^-8 below 1): to nearest the rows
    never move; stochastically they move by the updates' true amount on average."""
    means = {}
    for rounding in ("stochastic", "nearest"):
        table = E.TableConfig(vocabulary_size=256, dim=16, name="t", combiner="sum",
                              initializer=tf.constant_initializer(1.0))
        embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(1e-4),
                                       table_dtypes={"t": tf.bfloat16}, table_rounding=rounding)
        embedding.build(per_replica_batch_size=256)

        @tf.function
        def step():
            activations, preserved = embedding({"f": tf.range(256, dtype=tf.int64)})
            embedding.apply_gradients({"f": tf.ones_like(activations["f"])}, preserved)

        for _ in range(100):
            step()
        means[rounding] = float(np.mean(embedding.tables.read("t")))
    assert means["nearest"] == 1.0
    # 100 steps x 1e-4 = 0.01; 4096 values, each moving in steps of 2^-8 with probability
    # 1e-4 / 2^-8 per step: the mean's standard deviation is about 1.5e-4.
    assert abs(means["stochastic"] - 0.99) < 1e-3, means


def test_restore_mid_run_continues_bit_identically(tmp_path):
    strategy, embedding = make(1, tf.bfloat16)
    train(strategy, embedding, range(3))
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    assert embedding.update_step() == 3
    uninterrupted = train(strategy, embedding, range(3, 6))
    require_replicas(2)
    strategy, restored = make(2, tf.bfloat16, build=False)
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    restored.build(per_replica_batch_size=B // 2)
    assert restored.update_step() == 3
    resumed = train(strategy, restored, range(3, 6))
    for name in uninterrupted:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


def test_checkpoints_hold_float32_and_move_between_dtypes(tmp_path):
    strategy, bf16 = make(1, tf.bfloat16)
    values = train(strategy, bf16, range(2))
    path = tf.train.Checkpoint(embedding=bf16).save(str(tmp_path / "bf16"))
    reader = tf.train.load_checkpoint(path)
    assert reader.get_variable_to_dtype_map()["embedding/big/.ATTRIBUTES/VARIABLE_VALUE"] == \
        tf.float32
    _, fp32 = make(1, tf.float32, build=False)
    status = tf.train.Checkpoint(embedding=fp32).restore(path)
    status.expect_partial()   # the float32 embedding has no update step
    fp32.build(per_replica_batch_size=B)
    for name in values:   # bfloat16 values are exact in float32
        np.testing.assert_array_equal(fp32.tables.read(name), values[name])
    strategy, fp32_trained = make(1, tf.float32)
    trained = train(strategy, fp32_trained, range(2))
    path = tf.train.Checkpoint(embedding=fp32_trained).save(str(tmp_path / "fp32"))
    _, narrowed = make(1, tf.bfloat16)
    tf.train.Checkpoint(embedding=narrowed).restore(path).expect_partial()
    for name in trained:   # narrowed to the nearest bfloat16
        want = trained[name].astype(tf.bfloat16.as_numpy_dtype).astype(np.float32)
        np.testing.assert_array_equal(narrowed.tables.read(name), want)


def test_float16_overflow_fails_naming_the_table_and_writes_nothing():
    table = E.TableConfig(vocabulary_size=8, dim=8, name="hot", combiner="sum",
                          initializer=tf.constant_initializer(60000.0))
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(1.0),
                                   table_dtypes={"hot": tf.float16})
    embedding.build(per_replica_batch_size=8)

    def step(scale):
        activations, preserved = embedding({"f": tf.range(8, dtype=tf.int64)})
        embedding.apply_gradients({"f": scale * tf.ones_like(activations["f"])}, preserved)

    before = embedding.tables.read("hot")
    with pytest.raises(tf.errors.InvalidArgumentError, match="table '.*'.*float16's range"):
        step(-10000.0)
    np.testing.assert_array_equal(embedding.tables.read("hot"), before)
    step(100.0)   # a later step works (60000 - 100, rounded to a float16 step of 32)
    assert np.all(embedding.tables.read("hot") < 60000.0)


@pytest.mark.parametrize("table_dtypes,message", [
    ({"big": tf.int8}, "table 'big': int8 is not a training format"),
    ({"big": tf.float64}, "table 'big': table_dtypes must be one of"),
    ({"nope": tf.bfloat16}, r"table_dtypes names unknown tables \['nope'\]"),
])
def test_bad_table_dtypes_fail_at_construction(table_dtypes, message):
    table = E.TableConfig(vocabulary_size=8, dim=8, name="big")
    with pytest.raises(ValueError, match=message):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.SGD(0.1),
                           table_dtypes=table_dtypes)


def test_table_config_keys_and_row_wise_adagrad_with_bfloat16():
    """bfloat16 rows with row-wise Adagrad at dim 32: 64 bytes of row and 4 of accumulator per
    row (keys may be TableConfigs)."""
    table = E.TableConfig(vocabulary_size=1000, dim=32, name="video",
                          optimizer=sce.RowWiseAdagrad(learning_rate=0.05))
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.Adagrad(0.05),
                                   table_dtypes={table: tf.bfloat16})
    embedding.build(per_replica_batch_size=8)
    stored = sum(v.shape.num_elements() * v.dtype.size
                 for v in embedding.storage.local_variables())
    assert stored / 1000 <= 72   # 64 bytes of bfloat16 row + 4 of accumulator, plus padding
