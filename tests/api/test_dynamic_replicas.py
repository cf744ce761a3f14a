"""Open-vocabulary tables over several replicas (docs/dynamic_vocabulary.md#several-replicas):
keys exchanged to the map of their owner shard, against a fixed-vocabulary twin on as many
replicas (bit for bit), the numpy reference of whole steps, and checkpoints restored into other
replica counts."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import tf_sc_embedding as sce
from tests.api import parity_helpers as ph
from tests.api.test_dynamic_vocabulary import (DIM, keras_model, key_values, make_embedding,
                                               random_batches, run_against_reference, train)
from tests.reference import key_hashing
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding.exchanges import key_exchange

E = tf.tpu.experimental.embedding
BATCH = 16   # 4 replicas x 4 SparseCores


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 6), max_size=24), seed=st.integers(0, 2**16))
def test_every_occurrence_repeats_each_key_its_count(counts, seed):
    """The owner's expansion of distinct keys into every occurrence equals np.repeat, for int64
    and string keys, zero counts and no keys included (O(occurrences), unlike tf.repeat's
    [keys, max count] mask)."""
    keys = np.random.default_rng(seed).integers(-50, 50, len(counts)).astype(np.int64)
    counts = np.array(counts, np.int32)
    got = key_exchange.every_occurrence(tf.constant(keys), tf.constant(counts))
    np.testing.assert_array_equal(got.numpy(), np.repeat(keys, counts))
    strings = np.array([b"k%d" % k for k in keys], dtype=object)
    got = key_exchange.every_occurrence(tf.constant(strings, tf.string), tf.constant(counts))
    assert got.numpy().tolist() == np.repeat(strings, counts).tolist()


def _first_appearance_numbers(batches):
    number = {}
    for batch in batches:
        for samples in batch.values():
            for sample in samples:
                for k in sample:
                    number.setdefault(k, len(number))
    return number


@pytest.mark.parametrize("replicas,key_dtype,kind,combiner,optimizer,pipelined", [
    (2, tf.int64, "ragged", "mean", "adagrad", False),
    pytest.param(4, tf.string, "sparse", "sum", "adam", False, marks=pytest.mark.slow),
    (2, tf.string, "dense", "sqrtn", "row_wise_adagrad", False),
    pytest.param(4, tf.int64, "ragged", "mean", "ftrl", False, marks=pytest.mark.slow),
    (2, tf.string, "ragged", "sum", "adam", True),
    pytest.param(4, tf.int64, "sparse", "mean", "adagrad", True, marks=pytest.mark.slow),
])
def test_identity_with_a_fixed_vocabulary_over_several_replicas(replicas, key_dtype, kind,
                                                                 combiner, optimizer, pipelined):
    """Threshold 1, no eviction, exactly as many rows as keys (whose owners hold uneven numbers
    of them: maps lend each other rows), one initial value for every row: on R replicas every
    activation and every key's row equal, bit for bit, those of a fixed table on R
    replicas trained on the keys renumbered 0..n-1 (both pipelined, or neither)."""
    rng = np.random.default_rng(11)
    keys = key_values(rng, 40, key_dtype)
    batches = random_batches(rng, 4, BATCH, keys, equal_lengths=kind == "dense")
    number = _first_appearance_numbers(batches)
    initializer = tf.constant_initializer(0.125)
    strategy = ph.make_strategy(replicas)
    with strategy.scope():
        dynamic = make_embedding(
            E.TableConfig(vocabulary_size=len(number), dim=DIM, initializer=initializer,
                          combiner=combiner, name="items"), ph.make_optimizer(optimizer),
            dynamic_vocabularies={"items": sce.DynamicVocabulary(key_dtype=key_dtype)},
            pipeline_execution_with_tensor_core=pipelined)
        fixed = make_embedding(
            E.TableConfig(vocabulary_size=len(number), dim=DIM, initializer=initializer,
                          combiner=combiner, name="items"), ph.make_optimizer(optimizer),
            pipeline_execution_with_tensor_core=pipelined)
    got = train(dynamic, batches, kind, key_dtype, strategy)
    renumbered = [{f: [[number[k] for k in sample] for sample in samples]
                   for f, samples in batch.items()} for batch in batches]
    want = train(fixed, renumbered, kind, tf.int64, strategy)
    for step, (a, b) in enumerate(zip(got, want)):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step} {name}")
    exported_keys, values = dynamic.export_dynamic_table("items")
    assert list(exported_keys) == sorted(number)
    table = fixed.embedding_tables[fixed.tables.config("items")]
    np.testing.assert_array_equal(values, table[[number[k] for k in exported_keys]])
    counters = dynamic.counters()
    assert set(counters.unadmitted_ids.values()) == set(counters.refused_keys.values()) == {0}


@pytest.mark.parametrize("replicas,pipelined", [(2, False), (4, False), (2, True)])
def test_admission_and_eviction_over_replicas_match_the_reference(replicas, pipelined):
    """Counts over every replica's batch decide admission; eviction is by step. With room in
    every shard, the keys, rows and counters equal the one-map numpy reference (pipelined: with
    each update one step late)."""
    embedding, reference = run_against_reference(
        21 + replicas, threshold=3, steps_to_live=1, capacity=96, optimizer="adagrad",
        combiner="mean", distinct=18, steps=6, replicas=replicas, batch=BATCH,
        pipelined=pipelined)
    assert sum(embedding.counters().unadmitted_ids.values()) == reference.counters["unadmitted_ids"] > 0
    assert sum(embedding.counters().refused_keys.values()) == reference.counters["refused_keys"] == 0


def test_new_rows_are_drawn_from_their_keys_on_any_replica_count():
    """A new row's random initial values depend on its table and key only: the same on 1, 2 and
    4 replicas, whatever the step or the order of admission."""
    exported = {}
    batches = [{"f1": [[k] for k in range(100, 100 + BATCH)], "f2": [[]] * BATCH},
               {"f1": [[-k] for k in range(BATCH)], "f2": [[5]] * BATCH}]
    for replicas in (1, 2, 4):
        strategy = ph.make_strategy(replicas)
        with strategy.scope():
            embedding = make_embedding(
                E.TableConfig(vocabulary_size=64, dim=DIM, name="items",
                              initializer=tf.initializers.TruncatedNormal(stddev=0.1)),
                E.SGD(0.0), dynamic_vocabularies={"items": sce.DynamicVocabulary()})
        train(embedding, batches if replicas != 2 else batches[::-1], "ragged", tf.int64,
              strategy)
        exported[replicas] = embedding.export_dynamic_table("items")
    keys, values = exported[1]
    for replicas in (2, 4):
        np.testing.assert_array_equal(exported[replicas][0], keys)
        np.testing.assert_array_equal(exported[replicas][1], values)
    assert np.all(np.abs(values) <= 0.2) and len({tuple(v) for v in values}) == len(keys)
    seed = fused_update.table_seed("items")
    for key, row in zip(keys[:5], values[:5]):
        want = [key_hashing.keyed_value(seed, key, c, "truncated_normal", 0.0, 0.1)
                for c in range(DIM)]
        np.testing.assert_allclose(row, want, rtol=2e-7, atol=1e-8)


def _checkpoint_embedding(strategy, capacity=48):
    with strategy.scope():
        return make_embedding(
            E.TableConfig(vocabulary_size=capacity, dim=DIM, name="items", combiner="mean",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1)),
            ph.make_optimizer("adagrad"), dynamic_vocabularies={
                "items": sce.DynamicVocabulary(key_dtype=tf.string, admission_threshold=2,
                                               steps_to_live=2)})


@pytest.mark.parametrize("source,target", [pytest.param(1, 2, marks=pytest.mark.slow),
                                           pytest.param(2, 4, marks=pytest.mark.slow),
                                           (4, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_checkpoint_restores_into_other_replica_counts(tmp_path, source, target):
    """The logical state is the same after a restore on any replica count, and training goes on:
    keys, counts and last-seen steps exactly as in the uninterrupted run on the target count,
    values too on the same count (across counts, cross-replica sums round differently)."""
    rng = np.random.default_rng(source * 10 + target)
    keys = key_values(rng, 20, tf.string)
    batches = random_batches(rng, 6, BATCH, keys)
    strategy = ph.make_strategy(source)
    original = _checkpoint_embedding(strategy)
    train(original, batches[:3], "ragged", tf.string, strategy)
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    saved = original.dynamic_tables.logical_state("items")

    strategy = ph.make_strategy(target)
    restored = _checkpoint_embedding(strategy)
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    for part, value in restored.dynamic_tables.logical_state("items").items():
        np.testing.assert_array_equal(value, saved[part], err_msg=part)
    got = train(restored, batches[3:], "ragged", tf.string, strategy)

    uninterrupted = _checkpoint_embedding(strategy)
    want = train(uninterrupted, batches, "ragged", tf.string, strategy)[3:]
    exact = source == target
    for step, (a, b) in enumerate(zip(got, want)):
        for name in a:
            if exact:
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step} {name}")
            else:
                ph.assert_close(a[name], b[name], f"step {step} {name}")
    state = restored.dynamic_tables.logical_state("items")
    reference = uninterrupted.dynamic_tables.logical_state("items")
    for part in ("keys", "last_seen", "pending_keys", "pending_counts", "pending_last_seen",
                 "last_step"):
        np.testing.assert_array_equal(state[part], reference[part], err_msg=part)
    for part in ("values", "slot_accumulators"):
        if exact:
            np.testing.assert_array_equal(state[part], reference[part], err_msg=part)
        else:
            ph.assert_close(state[part], reference[part], part)


def test_a_full_checkpoint_restores_into_more_replicas_with_rows_lent(tmp_path):
    """The capacity is the whole table's, not a share per replica: a checkpoint holding exactly
    `capacity` keys restores into 4 replicas although their owners hold uneven numbers of them
    (the keys beyond a replica's share hold rows the others lend), and training goes on as on
    one replica."""
    rng = np.random.default_rng(8)
    keys = key_values(rng, 20, tf.string)
    one = ph.make_strategy(1)
    original = _checkpoint_embedding(one, capacity=24)
    train(original, random_batches(rng, 4, BATCH, keys), "ragged", tf.string, one)
    held_keys = original.export_dynamic_table("items")[0]
    held = len(held_keys)
    assert 12 < held <= 24
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    four = ph.make_strategy(4)
    full_four = _checkpoint_embedding(four, capacity=held)
    tf.train.Checkpoint(embedding=full_four).restore(path).assert_consumed()
    full_one = _checkpoint_embedding(one, capacity=held)
    tf.train.Checkpoint(embedding=full_one).restore(path).assert_consumed()
    table = full_four.dynamic_tables.table("items")
    sizes = [len(table.maps[r].export().keys.numpy()) for r in range(4)]
    assert sum(sizes) == held
    assert any(size > table.shards.capacity(r) for r, size in enumerate(sizes))
    batches = random_batches(rng, 3, BATCH, list(held_keys))
    got = train(full_four, batches, "ragged", tf.string, four)
    want = train(full_one, batches, "ragged", tf.string, one)
    for step, (a, b) in enumerate(zip(got, want)):
        for name in a:
            ph.assert_close(a[name], b[name], f"step {step} {name}")
    state = full_four.dynamic_tables.logical_state("items")
    reference = full_one.dynamic_tables.logical_state("items")
    for part in ("keys", "last_seen", "pending_keys", "pending_counts", "last_step"):
        np.testing.assert_array_equal(state[part], reference[part], err_msg=part)
    assert full_four.counters().refused_keys == full_one.counters().refused_keys
    assert set(full_one.counters().refused_keys.values()) == {0}


# 13-40 s each: with the slow tests (in the default run, keys are refused on one replica in
# tests/api/test_dynamic_prefetch.py).
@pytest.mark.parametrize("replicas,threshold,steps_to_live",
                         [pytest.param(2, 1, 0, marks=pytest.mark.slow),
                          pytest.param(4, 2, 2, marks=pytest.mark.slow),
                          pytest.param(2, 1, 1, marks=pytest.mark.slow)])
def test_keys_are_refused_only_when_every_row_of_the_table_is_taken(replicas, threshold,
                                                                    steps_to_live):
    """Maps share the table's capacity: a map whose own rows are taken borrows the others' free
    rows in the step, so after every step the table holds min(capacity, keys that earned a row)
    keys, and a step that refuses a key leaves no row free; two keys never share a row."""
    rng = np.random.default_rng(30 + replicas)
    keys = key_values(rng, 60, tf.int64)
    capacity = 13
    strategy = ph.make_strategy(replicas)
    with strategy.scope():
        embedding = make_embedding(
            E.TableConfig(vocabulary_size=capacity, dim=DIM, name="items",
                          initializer=tf.constant_initializer(0.25)), E.SGD(0.1),
            dynamic_vocabularies={"items": sce.DynamicVocabulary(
                admission_threshold=threshold, steps_to_live=steps_to_live or None)})
    refused = 0
    for batch in random_batches(rng, 8, BATCH, keys):
        train(embedding, [batch], "ragged", tf.int64, strategy)
        held, _ = embedding.export_dynamic_table("items")
        assert len(held) <= capacity
        if sum(embedding.counters().refused_keys.values()) > refused:
            assert len(held) == capacity
        refused = sum(embedding.counters().refused_keys.values())
        table = embedding.dynamic_tables.table("items")
        _, rows = table.export_state()
        assert len(np.unique(rows)) == len(rows)
    assert refused > 0


def test_inference_over_replicas_reads_rows_without_admitting():
    """training=False on several replicas: held keys read their rows, others zeros; the maps do
    not change."""
    strategy = ph.make_strategy(2)
    with strategy.scope():
        embedding = make_embedding(
            E.TableConfig(vocabulary_size=32, dim=DIM, name="items",
                          initializer=tf.constant_initializer(0.5)), E.SGD(0.0),
            names=("f1",), dynamic_vocabularies={"items": sce.DynamicVocabulary()})
    train(embedding, [{"f1": [[k] for k in range(BATCH)]}], "ragged", tf.int64, strategy)
    before = embedding.dynamic_tables.logical_state("items")

    @tf.function
    def infer(features):
        return strategy.run(lambda f: embedding(f, training=False)[0], args=(features,))

    samples = [[k + 8] for k in range(BATCH)]   # keys 8..23: 8..15 held, 16..23 not
    per_replica = [{"f1": tf.ragged.constant(samples[r * 8:(r + 1) * 8], tf.int64)}
                   for r in range(2)]
    outputs = infer(strategy.experimental_distribute_values_from_function(
        lambda context: per_replica[context.replica_id_in_sync_group]))
    got = np.concatenate([x.numpy() for x in strategy.experimental_local_results(outputs["f1"])])
    np.testing.assert_array_equal(got[:8], np.full((8, DIM), 0.5, np.float32))
    np.testing.assert_array_equal(got[8:], np.zeros((8, DIM), np.float32))
    after = embedding.dynamic_tables.logical_state("items")
    for part in before:
        np.testing.assert_array_equal(after[part], before[part], err_msg=part)


def test_a_capacity_below_the_replica_count_fails_at_construction():
    strategy = ph.make_strategy(4)
    with strategy.scope(), pytest.raises(ValueError, match="table 'items'.*at least one row per "
                                                            "replica"):
        make_embedding(E.TableConfig(vocabulary_size=3, dim=DIM, name="items"), E.SGD(0.1),
                       dynamic_vocabularies={"items": sce.DynamicVocabulary()})


def _keras_fit(strategy, keys, labels):
    model, layer = keras_model(BATCH, strategy)
    model.fit(tf.data.Dataset.from_tensor_slices((keys, labels)).batch(BATCH), epochs=2,
              verbose=0)
    return layer.embedding


def test_keras_fit_over_two_replicas_admits_the_same_keys():
    """EmbeddingLayer with a dynamic string table under MirroredStrategy: fit admits the keys
    one replica admits (counted over both replicas' batches), with the same rows up to the
    rounding of the cross-replica sums."""
    rng = np.random.default_rng(4)
    keys = np.array([b"k%d" % i for i in rng.integers(0, 9, 64)], dtype=object)
    labels = rng.normal(size=(64, 1)).astype(np.float32)
    one = _keras_fit(ph.make_strategy(1), keys, labels).dynamic_tables.logical_state("words")
    two = _keras_fit(ph.make_strategy(2), keys, labels).dynamic_tables.logical_state("words")
    for part in ("keys", "last_seen", "pending_keys", "pending_counts", "last_step"):
        np.testing.assert_array_equal(two[part], one[part], err_msg=part)
    ph.assert_close(two["values"], one["values"], "values")


@pytest.mark.parametrize("corrupt", ["held_and_pending", "unsorted", "zero_count",
                                     "seen_after_last"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_state_the_maps_would_reject_fails_before_any_map_changes(replicas, corrupt):
    """Every rule of the maps' own import is checked on the whole state first: a state that
    breaks one (here in the part of the last replica's map) fails naming the table, and every
    key keeps its row and values (the maps give rows in admission order, not key order, so a
    map re-imported by key order would point its keys at other keys' values)."""
    rng = np.random.default_rng(31)
    strategy = ph.make_strategy(replicas)
    with strategy.scope():
        embedding = make_embedding(
            E.TableConfig(vocabulary_size=48, dim=DIM, name="items",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1)),
            ph.make_optimizer("adagrad"),
            dynamic_vocabularies={"items": sce.DynamicVocabulary(admission_threshold=2)})
    keys = np.arange(1, 25, dtype=np.int64) * 7919
    once = -np.arange(1, 2 * BATCH + 1, dtype=np.int64)   # seen once each: pending
    train(embedding, random_batches(rng, 3, BATCH, keys) + [
        {"f1": [[k] for k in once[:BATCH]], "f2": [[k] for k in once[BATCH:]]}],
        "ragged", tf.int64, strategy)
    state = embedding.dynamic_tables.logical_state("items")
    bad = {part: np.array(value, copy=True) for part, value in state.items()}
    held = [k for k in bad["keys"] if key_hashing.owner_shard(k, replicas) == replicas - 1]
    assert len(bad["keys"]) >= 2 and len(bad["pending_keys"]) >= 1 and held
    if corrupt == "held_and_pending":
        pending = np.sort(np.append(bad["pending_keys"], held[0]))
        at = int(np.searchsorted(pending, held[0]))
        bad["pending_keys"] = pending
        bad["pending_counts"] = np.insert(bad["pending_counts"], at, 1)
        bad["pending_last_seen"] = np.insert(bad["pending_last_seen"], at, 0)
    elif corrupt == "unsorted":
        bad["keys"][[0, 1]] = bad["keys"][[1, 0]]
    elif corrupt == "zero_count":
        bad["pending_counts"][0] = 0
    else:
        bad["last_seen"][list(bad["keys"]).index(held[0])] = int(bad["last_step"]) + 1
    with pytest.raises(ValueError, match="table 'items'.*Nothing was restored"):
        embedding.dynamic_tables.restore("items", bad)
    after = embedding.dynamic_tables.logical_state("items")
    for part in state:
        np.testing.assert_array_equal(after[part], state[part], err_msg=part)


def test_every_map_of_a_table_maps_the_same_step():
    """The maps agree on the step (their last steps ride in the key exchange's all-gather): a
    map left behind or ahead, as a step aborted on some replicas leaves it, is brought to the
    same step by the next one, so keys expire alike on every shard."""
    strategy = ph.make_strategy(2)
    with strategy.scope():
        embedding = make_embedding(
            E.TableConfig(vocabulary_size=32, dim=DIM, name="items"), E.SGD(0.1),
            names=("f1",), dynamic_vocabularies={"items": sce.DynamicVocabulary(
                steps_to_live=2)})
    batch = [{"f1": [[k] for k in range(BATCH)]}]
    train(embedding, batch, "ragged", tf.int64, strategy)
    table = embedding.dynamic_tables.table("items")
    assert [int(table.last_step(r)) for r in (0, 1)] == [0, 0]
    table.maps[1].map_step(tf.constant([], tf.int64), 4)   # replica 1's map ran ahead
    train(embedding, batch, "ragged", tf.int64, strategy)
    assert [int(table.last_step(r)) for r in (0, 1)] == [5, 5]
    assert int(embedding.dynamic_tables.logical_state("items")["last_step"]) == 5
