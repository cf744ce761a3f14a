"""wire_precision="16bit" (tf_sc_embedding/collectives/wire.py): the all-to-all exchanges send rows
as float16 and gradients as bfloat16, rounded to nearest even, and widen them back at once.

Checked against an exact model of the rule: with every table value and every gradient
representable in 16 bits the narrowing loses nothing, so the 16-bit wire must give the float32
wire's bits; with arbitrary values it must give the same bits on every run, stay within 16-bit
rounding of the float32 wire, and send fewer bytes. One replica sends nothing, so there the
option changes no bit."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.devices import mirrored_strategy
from tf_sc_embedding.collectives import wire

E = tf.tpu.experimental.embedding
BATCH = 16
STEPS = 3


def features(exact):
    """Two tables (stacked) of values exact in float16 when `exact` (multiples of 1/64 in
    [-0.5, 0.5]), else uniform float32 values."""
    rng = np.random.default_rng(3)
    tables = []
    for i, (vocab, dim) in enumerate([(61, 8), (130, 16)]):
        values = rng.uniform(-0.5, 0.5, size=(vocab, dim)).astype(np.float32)
        if exact:
            values = np.round(values * 64) / 64
        tables.append(E.TableConfig(vocabulary_size=vocab, dim=dim, combiner="sum", name=f"t{i}",
                                    initializer=tf.constant_initializer(values)))
    return {f"f{i}": E.FeatureConfig(table=t, name=f"f{i}") for i, t in enumerate(tables)}


def batches(config, replicas):
    rng = np.random.default_rng(11)
    return [[{name: tf.RaggedTensor.from_row_lengths(
        rng.integers(0, f.table.vocabulary_size, size=3 * BATCH).astype(np.int64),
        np.full(BATCH, 3)) for name, f in config.items()} for _ in range(replicas)]
        for _ in range(STEPS)]


def train(replicas, precision, exact, optimizer):
    """(every step's activations, the logical tables, bytes sent, collectives launched per replica
    per step) of a few steps. With `exact`
    the gradients are +-1/8 (their sums per id, a few multiples of 1/8, are exact in bfloat16)
    and SGD with learning rate 1/2 keeps the tables on the 1/64 grid below 4 (exact in float16);
    otherwise they are the activations times 1/4 plus 1/8."""
    strategy = mirrored_strategy(replicas) if replicas > 1 else tf.distribute.get_strategy()
    config = features(exact)
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(config, optimizer, exchange="all_to_all",
                                       wire_precision=precision)
    embedding.build(per_replica_batch_size=BATCH)

    @tf.function
    def step(ids):
        def replica_step(ids):
            activations, preserved = embedding(ids)
            gradient = ((lambda a: tf.sign(a) * 0.125) if exact else
                        (lambda a: a * 0.25 + 0.125))
            embedding.apply_gradients(tf.nest.map_structure(gradient, activations), preserved)
            return activations
        return strategy.run(replica_step, args=(ids,))

    outputs = []
    for per_replica in batches(config, replicas):
        inputs = (strategy.experimental_distribute_values_from_function(
            lambda ctx, p=per_replica: p[ctx.replica_id_in_sync_group])
            if replicas > 1 else per_replica[0])
        activations = step(inputs)
        outputs.append({name: np.concatenate(
            [v.numpy() for v in strategy.experimental_local_results(value)])
            for name, value in activations.items()})
    counters = embedding.counters()
    sent = sum(counters.collective_bytes_sent.values())
    launched = sum(counters.collective_launches.values()) / (replicas * STEPS)
    return outputs, embedding.logical_tables(), sent, launched


def assert_same_bits(a, b):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_array_equal(x, y)


def test_the_rule_narrows_only_named_float_payloads():
    assert wire.wire_dtype("float32", wire.ROWS) is None
    assert wire.wire_dtype("16bit", wire.ROWS) == tf.float16
    assert wire.wire_dtype("16bit", wire.GRADIENTS) == tf.bfloat16
    assert wire.wire_dtype("16bit", None) is None
    sent = []
    ids = tf.constant([[3], [7]], tf.int32)
    assert wire.on_the_wire(lambda v: sent.append(v.dtype) or v, ids, "16bit", wire.ROWS) is ids
    value = tf.constant([1.0 + 2.0 ** -12, 70000.0])   # below float16's step; beyond its range
    got = wire.on_the_wire(lambda v: sent.append(v.dtype) or v, value, "16bit", wire.ROWS)
    assert sent == [tf.int32, tf.float16] and got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), [1.0, np.inf])
    got = wire.on_the_wire(lambda v: v, value, "16bit", wire.GRADIENTS)
    np.testing.assert_array_equal(got.numpy(), [1.0, 70144.0])   # bfloat16: 8 bits of mantissa


def test_an_unknown_wire_precision_fails_at_construction():
    with pytest.raises(ValueError, match="wire_precision must be one of"):
        sce.EmbeddingOptions(wire_precision="8bit")
    with pytest.raises(ValueError, match="wire_precision"):
        sce.TPUEmbeddingV2(features(True), E.SGD(0.5), wire_precision="float16")


def test_values_exact_in_16_bits_cross_the_16_bit_wire_unchanged():
    exact = train(2, "float32", True, E.SGD(learning_rate=0.5))
    narrow = train(2, "16bit", True, E.SGD(learning_rate=0.5))
    assert_same_bits(narrow[:2], exact[:2])
    # Rows and gradients halved; ids, counts and marks as before (0.76 if only rows were).
    assert narrow[2] < 0.6 * exact[2], (narrow[2], exact[2])


def test_the_16_bit_wire_is_deterministic_and_within_its_rounding():
    first = train(2, "16bit", False, E.Adagrad(learning_rate=0.1))
    again = train(2, "16bit", False, E.Adagrad(learning_rate=0.1))
    exact = train(2, "float32", False, E.Adagrad(learning_rate=0.1))
    assert_same_bits(first[:2], again[:2])
    differs = False
    for got, want in zip(first[0] + [first[1]], exact[0] + [exact[1]]):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-2, atol=2e-3,
                                       err_msg=name)
            differs |= not np.array_equal(got[name], want[name])
    assert differs   # float16 rows and bfloat16 gradients did round


def test_one_replica_sends_nothing_and_changes_no_bit():
    assert_same_bits(train(1, "16bit", False, E.Adagrad(learning_rate=0.1))[:2],
                     train(1, "float32", False, E.Adagrad(learning_rate=0.1))[:2])
