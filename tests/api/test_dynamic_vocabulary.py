"""TPUEmbeddingV2 with open vocabularies (docs/dynamic_vocabulary.md): int64 and string keys,
admission, eviction and capacity through the class, against a fixed-vocabulary twin (bit for bit)
and against the numpy reference of whole steps (tests/reference/dynamic_training.py)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

import tf_sc_embedding as sce
from tf_sc_embedding import private_tf
from tests.api import parity_helpers as ph
from tests.api import reference_training as ref
from tests.reference.dynamic_training import ReferenceDynamicTable

E = tf.tpu.experimental.embedding
DIM = 4
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])
# dA = LOSS_SCALE * a + OFFSETS[feature]: exact in float32 in TensorFlow and numpy alike.
OFFSETS = {"f1": np.float32(0.25), "f2": np.float32(-0.125)}


def ids_tensor(samples, kind, dtype):
    """One feature's batch (a list of samples, each a list of keys) as a dense, ragged or sparse
    tensor of `dtype`."""
    ragged = tf.ragged.constant(samples, dtype=dtype, ragged_rank=1)
    if kind == "dense":
        return ragged.to_tensor()
    if kind == "sparse":
        return ragged.to_sparse()
    return ragged


def make_embedding(table, optimizer, names=("f1", "f2"), **options):
    features = {name: E.FeatureConfig(table=table, name=name) for name in names}
    return sce.TPUEmbeddingV2(features, optimizer=optimizer, **options)


def train(embedding, batches, kind, dtype, strategy=None):
    """Trains one step per batch ({feature: samples}); returns each step's activations (numpy).
    With a strategy of R replicas, replica r takes the r-th of R equal slices of each batch."""
    def replica_step(features):
        activations, preserved = embedding(features)
        gradients = {k: ph.LOSS_SCALE * a + OFFSETS[k] for k, a in activations.items()}
        with tf.control_dependencies(embedding.apply_gradients(gradients, preserved)):
            return {k: tf.identity(a) for k, a in activations.items()}

    if strategy is None:
        step = tf.function(replica_step)
        return [{k: v.numpy() for k, v in step({k: ids_tensor(s, kind, dtype)
                                                 for k, s in batch.items()}).items()}
                for batch in batches]
    step = tf.function(lambda features: strategy.run(replica_step, args=(features,)))
    replicas = strategy.num_replicas_in_sync
    results = []
    for batch in batches:
        size = len(next(iter(batch.values()))) // replicas
        per_replica = [{k: ids_tensor(s[r * size:(r + 1) * size], kind, dtype)
                        for k, s in batch.items()} for r in range(replicas)]
        outputs = step(strategy.experimental_distribute_values_from_function(
            lambda context: per_replica[context.replica_id_in_sync_group]))
        results.append({k: np.concatenate([x.numpy() for x in
                                           strategy.experimental_local_results(v)])
                        for k, v in outputs.items()})
    return results


def random_batches(rng, steps, batch, keys, max_ids=3, equal_lengths=False):
    out = []
    for _ in range(steps):
        out.append({name: [list(rng.choice(keys, size=max_ids if equal_lengths else
                                          int(rng.integers(1, max_ids + 1))))
                           for _ in range(batch)] for name in OFFSETS})
    return out


def key_values(rng, count, dtype):
    if dtype == tf.string:
        return np.array([f"item-{int(v):x}".encode() for v in rng.integers(0, 1 << 40, count)],
                        dtype=object)
    values = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, count, dtype=np.int64)
    values[0] = -1   # negative keys are keys like any other
    return values


@pytest.mark.parametrize("key_dtype,kind,combiner,optimizer", [
    (tf.int64, "ragged", "mean", "adagrad"),
    (tf.int64, "sparse", "sum", "adam"),
    (tf.string, "dense", "sqrtn", "ftrl"),
    (tf.string, "ragged", "mean", "row_wise_adagrad"),
])
def test_identity_with_a_fixed_vocabulary(key_dtype, kind, combiner, optimizer):
    """Threshold 1, no eviction, room for every key, one initial value for every row: each key's
    row equals, bit for bit, the row of a fixed table trained on the keys renumbered 0..n-1 in
    order of first appearance, and so does every activation.

    Dynamic tables sum each sample's rows in input order, as the all-to-all exchange does, so the
    fixed twin runs over two replicas (all-to-all). Against one replica (its CSR lookup sums a
    sample's rows in row order), the numbers agree within float32 rounding."""
    rng = np.random.default_rng(7)
    keys = key_values(rng, 40, key_dtype)
    batches = random_batches(rng, 4, 8, keys, equal_lengths=kind == "dense")
    number = {}   # 0..n-1 in order of first appearance (step, feature, sample): then the
    for batch in batches:   # CSR sums every sample's ids in the same order in both tables
        for samples in batch.values():
            for sample in samples:
                for k in sample:
                    number.setdefault(k, len(number))
    initializer = tf.constant_initializer(0.125)
    dynamic = make_embedding(
        E.TableConfig(vocabulary_size=64, dim=DIM, initializer=initializer, combiner=combiner,
                      name="items"), ph.make_optimizer(optimizer),
        dynamic_vocabularies={"items": sce.DynamicVocabulary(key_dtype=key_dtype)})
    renumbered = [{f: [[number[k] for k in sample] for sample in samples]
                   for f, samples in batch.items()} for batch in batches]
    got = train(dynamic, batches, kind, key_dtype)
    exported_keys, values = dynamic.export_dynamic_table("items")
    seen = sorted({k for batch in batches for s in batch.values() for sample in s for k in sample})
    assert list(exported_keys) == seen
    counters = dynamic.counters()
    assert set(counters.unadmitted_ids.values()) == set(counters.refused_keys.values()) == {0}
    for replicas in (2, 1):
        strategy = ph.make_strategy(replicas)
        with strategy.scope():
            fixed = make_embedding(
                E.TableConfig(vocabulary_size=len(number), dim=DIM, initializer=initializer,
                              combiner=combiner, name="items"), ph.make_optimizer(optimizer))
        want = train(fixed, renumbered, kind, tf.int64, strategy)
        table = fixed.embedding_tables[fixed.tables.config("items")]
        rows = table[[number[k] for k in exported_keys]]
        if replicas == 2:
            for step, (a, b) in enumerate(zip(got, want)):
                for name in a:
                    np.testing.assert_array_equal(a[name], b[name],
                                                  err_msg=f"step {step} {name}")
            np.testing.assert_array_equal(values, rows)
        else:
            for a, b in zip(got, want):
                for name in a:
                    ph.assert_close(a[name], b[name], f"activations of {name}")
            ph.assert_close(values, rows, "rows")


def run_against_reference(seed, threshold, steps_to_live, capacity, optimizer, combiner,
                          distinct, steps=5, replicas=1, batch=8, pipelined=False):
    """Trains `steps` random batches through the class (on `replicas` replicas, pipelined or
    not) and through the numpy reference, comparing activations, exported rows and counters;
    returns (embedding, reference)."""
    rng = np.random.default_rng(seed)
    keys = np.arange(-distinct // 2, distinct - distinct // 2, dtype=np.int64) * 7919
    batches = random_batches(rng, steps, batch, keys)
    config = ph.make_optimizer(optimizer)
    strategy = ph.make_strategy(replicas) if replicas > 1 else None
    with (strategy or tf.distribute.get_strategy()).scope():
        embedding = make_embedding(
            E.TableConfig(vocabulary_size=capacity, dim=DIM, combiner=combiner, name="items",
                          initializer=tf.constant_initializer(0.5)), config,
            dynamic_vocabularies={"items": sce.DynamicVocabulary(
                admission_threshold=threshold, steps_to_live=steps_to_live)},
            pipeline_execution_with_tensor_core=pipelined)
    reference = ReferenceDynamicTable(capacity, DIM, config, 0.5, threshold, steps_to_live or 0,
                                      pipelined=pipelined)
    got = train(embedding, batches, "ragged", tf.int64, strategy)
    for step, batch in enumerate(batches):
        features = {f: ref.Feature("items", combiner, samples) for f, samples in batch.items()}
        want = reference.train_step(features, lambda acts: {
            f: ph.LOSS_SCALE * a + OFFSETS[f] for f, a in acts.items()})
        for name in want:
            ph.assert_close(got[step][name], want[name], f"step {step} activations {name}")
    exported_keys, values = embedding.export_dynamic_table("items")
    want_keys, want_values = reference.export()
    assert list(exported_keys) == want_keys
    ph.assert_close(values, want_values, "exported rows")
    assert sum(embedding.counters().unadmitted_ids.values()) == reference.counters["unadmitted_ids"]
    assert sum(embedding.counters().refused_keys.values()) == reference.counters["refused_keys"]
    return embedding, reference


@pytest.mark.parametrize("pipelined", [False, True])
def test_admission_eviction_and_capacity_match_the_reference(pipelined):
    # 12 distinct keys over 8 rows, threshold 2, rows given back after 1 unseen step; pipelined,
    # each update runs after the next step's lookup (rows given back included).
    run_against_reference(3, threshold=2, steps_to_live=1, capacity=8, optimizer="adagrad",
                           combiner="mean", distinct=12, steps=6, pipelined=pipelined)


@settings(max_examples=12, **SETTINGS)
@given(seed=st.integers(0, 2 ** 16), threshold=st.integers(1, 3),
       steps_to_live=st.sampled_from([None, 1, 2]), capacity=st.integers(1, 12),
       optimizer=st.sampled_from(["sgd", "adagrad", "adam"]),
       combiner=st.sampled_from(("sum", "mean", "sqrtn")),
       distinct=st.integers(1, 16), pipelined=st.booleans())
def test_property_matches_the_reference(seed, threshold, steps_to_live, capacity, optimizer,
                                        combiner, distinct, pipelined):
    run_against_reference(seed, threshold, steps_to_live, capacity, optimizer, combiner,
                           distinct, steps=4, pipelined=pipelined)


def test_a_step_that_skips_a_number_applies_the_kept_update_before_its_keys_expire():
    """Pipelined, a step's update runs after the next lookup. Key A, seen at step 0 only, could
    lose its row at step 2 (steps_to_live 1). Here the maps also map step 1 without training
    (as a step that failed after its lookup leaves them), so the next training step maps step 2
    while step 0's update of A's old row still waits. The kept update must then run before the
    maps: else it would land on the row A gets anew (the table's only row), on top of its fresh
    initial values."""
    table = E.TableConfig(vocabulary_size=1, dim=DIM, name="items", combiner="sum",
                          initializer=tf.constant_initializer(0.5))
    optimizer = ph.make_optimizer("sgd")
    embedding = make_embedding(table, optimizer, names=("f1",), dynamic_vocabularies={
        "items": sce.DynamicVocabulary(steps_to_live=1)},
        pipeline_execution_with_tensor_core=True)
    reference = ReferenceDynamicTable(1, DIM, optimizer, 0.5, 1, 1, pipelined=True)
    batches = [{"f1": [[key]] * 4} for key in (11, 22, 11)]

    def gradients_of(activations):
        return {k: ph.LOSS_SCALE * a + OFFSETS[k] for k, a in activations.items()}

    @tf.function
    def step(features):
        activations, preserved = embedding(features)
        with tf.control_dependencies(embedding.apply_gradients(gradients_of(activations),
                                                               preserved)):
            return {k: tf.identity(a) for k, a in activations.items()}

    def reference_features(batch):
        return {k: ref.Feature("items", "sum", v) for k, v in batch.items()}

    got, want = [], []
    for n, batch in enumerate(batches):
        if n == 1:   # the maps step without training: keys mapped, no update
            embedding.dynamic_tables.table("items").map_keys(
                0, tf.constant([22, 22, 22, 22], tf.int64))
            reference.map_only(reference_features(batch))
            continue
        got.append(step({"f1": tf.ragged.constant(batch["f1"], tf.int64)}))
        want.append(reference.train_step(reference_features(batch), gradients_of))
    for n, (a, b) in enumerate(zip(got, want)):
        ph.assert_close(a["f1"].numpy(), b["f1"], f"step {n} activations")
    exported_keys, values = embedding.export_dynamic_table("items")
    want_keys, want_values = reference.export()
    assert list(exported_keys) == want_keys == [11]
    ph.assert_close(values, want_values, "exported rows")
    assert sum(embedding.counters().refused_keys.values()) == reference.counters["refused_keys"] == 1


def test_dynamic_and_fixed_tables_in_one_embedding():
    """A dynamic table and a fixed one side by side: the fixed one trains as it would alone."""
    rng = np.random.default_rng(1)
    fixed_table = E.TableConfig(vocabulary_size=16, dim=DIM, name="fixed",
                                initializer=tf.constant_initializer(0.25))
    dynamic_table = E.TableConfig(vocabulary_size=16, dim=DIM, name="dynamic",
                                  initializer=tf.constant_initializer(0.25))
    features = {"f1": E.FeatureConfig(table=fixed_table, name="f1"),
                "f2": E.FeatureConfig(table=dynamic_table, name="f2")}
    both = sce.TPUEmbeddingV2(features, optimizer=E.Adagrad(0.1), dynamic_vocabularies={
        "dynamic": sce.DynamicVocabulary(key_dtype=tf.string)})
    alone = sce.TPUEmbeddingV2({"f1": E.FeatureConfig(table=fixed_table, name="f1")},
                               optimizer=E.Adagrad(0.1))
    batches = []
    for _ in range(3):
        batches.append({"f1": [list(rng.integers(0, 16, 2)) for _ in range(4)],
                        "f2": [[b"k%d" % v for v in rng.integers(0, 5, 2)] for _ in range(4)]})

    @tf.function
    def step(embedding, features):
        activations, preserved = embedding(features)
        gradients = {k: ph.LOSS_SCALE * a + OFFSETS[k] for k, a in activations.items()}
        with tf.control_dependencies(embedding.apply_gradients(gradients, preserved)):
            return {k: tf.identity(a) for k, a in activations.items()}

    for batch in batches:
        got = step(both, {"f1": tf.ragged.constant(batch["f1"], tf.int64),
                          "f2": tf.ragged.constant(batch["f2"], tf.string)})
        want = step(alone, {"f1": tf.ragged.constant(batch["f1"], tf.int64)})
        np.testing.assert_array_equal(got["f1"].numpy(), want["f1"].numpy())
    np.testing.assert_array_equal(both.embedding_tables[fixed_table],
                                  alone.embedding_tables[fixed_table])
    assert [t.name for t in both.embedding_tables] == ["fixed"]
    keys, values = both.export_dynamic_table(dynamic_table)
    assert list(keys) == sorted(keys) and len(keys) == len(set(keys)) and values.shape[1] == DIM


def test_bfloat16_rows():
    """A dynamic table stored in bfloat16 trains and exports float32 values."""
    embedding = make_embedding(
        E.TableConfig(vocabulary_size=8, dim=DIM, name="items",
                      initializer=tf.constant_initializer(0.5)), E.SGD(0.5), names=("f1",),
        dynamic_vocabularies={"items": sce.DynamicVocabulary()},
        table_dtypes={"items": tf.bfloat16})
    train(embedding, [{"f1": [[3], [5], [3], []]}], "ragged", tf.int64)
    keys, values = embedding.export_dynamic_table("items")
    assert list(keys) == [3, 5] and values.dtype == np.float32
    # Each row got dA = 0.5 * 0.5 + 0.25 per occurrence: 3 twice, 5 once.
    np.testing.assert_allclose(values[:, 0], [0.5 - 0.5 * 2 * 0.5, 0.5 - 0.5 * 0.5], atol=1e-2)
    # The lookup gathered the rows from the variable's value: no sparse TensorFlow op put the
    # table in copy-on-read mode (where every read, and every in-place update, copies it).
    tables = [shard for kinds in embedding.variables.values() for table in kinds.values()
              for shard in table.shards if shard.dtype == tf.bfloat16]
    assert tables
    for variable in tables:
        first = private_tf.numpy_view(variable.read_value())
        second = private_tf.numpy_view(variable.read_value())
        assert first.ctypes.data == second.ctypes.data, variable.name


def test_random_initializer_draws_new_rows():
    """New rows come from the table's initializer (here truncated normal), distinct per key."""
    embedding = make_embedding(
        E.TableConfig(vocabulary_size=8, dim=DIM, name="items",
                      initializer=tf.initializers.TruncatedNormal(stddev=0.1)), E.SGD(0.0),
        names=("f1",), dynamic_vocabularies={"items": sce.DynamicVocabulary()})
    train(embedding, [{"f1": [[1], [2], [], []]}, {"f1": [[3], [1], [], []]}], "ragged",
          tf.int64)
    keys, values = embedding.export_dynamic_table("items")
    assert list(keys) == [1, 2, 3]
    assert len({tuple(v) for v in values}) == 3 and np.all(np.abs(values) <= 0.2)


# ----------------------------------------------------------------------------- bad input
def test_wrong_key_dtypes_fail_naming_feature_and_table():
    dynamic_table = E.TableConfig(vocabulary_size=8, dim=DIM, name="words")
    fixed_table = E.TableConfig(vocabulary_size=8, dim=DIM, name="ids")
    embedding = sce.TPUEmbeddingV2(
        {"w": E.FeatureConfig(table=dynamic_table, name="w"),
         "i": E.FeatureConfig(table=fixed_table, name="i")}, optimizer=E.SGD(0.1),
        dynamic_vocabularies={"words": sce.DynamicVocabulary(key_dtype=tf.string)})
    good = {"w": tf.constant([[b"a"]] * 4), "i": tf.constant([[1]] * 4, tf.int64)}
    with pytest.raises(ValueError, match="feature 'w': table 'words'.*string keys; got int32"):
        embedding.embedding_lookup({**good, "w": tf.constant([[1]] * 4, tf.int32)})
    with pytest.raises(ValueError, match="feature 'i'.*table 'ids'.*string"):
        embedding.embedding_lookup({**good, "i": tf.constant([[b"x"]] * 4)})
    embedding.embedding_lookup(good)   # a failed call leaves the embedding usable


@pytest.mark.parametrize("vocabularies,match", [
    ({"nope": sce.DynamicVocabulary()}, "unknown tables"),
    ({"t": sce.DynamicVocabulary.from_config({"admission_threshold": 2})}, None),
    ({"t": {"admission_threshold": 0}}, "table 't'.*admission_threshold must be an integer >= 1"),
    ({"t": {"steps_to_live": 0}}, "table 't'.*steps_to_live must be an integer >= 1"),
    ({"t": {"key_dtype": "int32"}}, "table 't'.*key_dtype"),
    ({"t": 3}, "table 't'.*DynamicVocabulary"),
])
def test_construction_checks(vocabularies, match):
    table = E.TableConfig(vocabulary_size=8, dim=DIM, name="t")
    make = lambda: sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)},   # noqa: E731
                                      optimizer=E.SGD(0.1), dynamic_vocabularies=vocabularies)
    if match is None:
        make()
    else:
        with pytest.raises(ValueError, match=match):
            make()


def test_unsupported_initializer_fails_at_construction():
    table = E.TableConfig(vocabulary_size=8, dim=DIM, name="t",
                          initializer=lambda shape, dtype: tf.zeros(shape, dtype))
    with pytest.raises(ValueError, match="table 't'.*initializer"):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, optimizer=E.SGD(0.1),
                           dynamic_vocabularies={"t": sce.DynamicVocabulary()})


def test_export_of_a_fixed_table_fails():
    table = E.TableConfig(vocabulary_size=8, dim=DIM, name="t")
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, optimizer=E.SGD(0.1))
    with pytest.raises(ValueError, match="'t' is not a dynamic table"):
        embedding.export_dynamic_table("t")


# ----------------------------------------------------------------------------- checkpoints
def _checkpointed_embedding(capacity=16):
    table = E.TableConfig(vocabulary_size=capacity, dim=DIM, name="items", combiner="mean",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1))
    return make_embedding(table, ph.make_optimizer("adagrad"), dynamic_vocabularies={
        "items": sce.DynamicVocabulary(key_dtype=tf.string, admission_threshold=2,
                                       steps_to_live=2)})


@pytest.mark.parametrize("restore_before_build", [True, False])
def test_checkpoint_restores_the_logical_state_and_training_continues_exactly(
        tmp_path, restore_before_build):
    """Keys, rows, slots, counts, last-seen steps and the step survive a checkpoint: a restored
    embedding continues bit for bit like the uninterrupted one (new rows included)."""
    rng = np.random.default_rng(5)
    keys = key_values(rng, 14, tf.string)
    batches = random_batches(rng, 6, 8, keys)
    original = _checkpointed_embedding()
    train(original, batches[:3], "ragged", tf.string)
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    want = train(original, batches[3:], "ragged", tf.string)

    restored = _checkpointed_embedding()
    if not restore_before_build:
        restored.build(per_replica_batch_size=8)
        train(restored, random_batches(rng, 2, 8, key_values(rng, 5, tf.string)), "ragged",
              tf.string)   # state the restore must replace
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    got = train(restored, batches[3:], "ragged", tf.string)
    for step, (a, b) in enumerate(zip(got, want)):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step} {name}")
    for got_part, want_part in zip(restored.export_dynamic_table("items"),
                                   original.export_dynamic_table("items")):
        np.testing.assert_array_equal(got_part, want_part)
    for kind in ("keys", "last_seen", "pending_keys", "pending_counts", "slot_accumulators"):
        np.testing.assert_array_equal(restored.dynamic_tables.logical_state("items")[kind],
                                      original.dynamic_tables.logical_state("items")[kind])


def test_checkpoint_with_more_keys_than_the_capacity_fails_and_writes_nothing(tmp_path):
    rng = np.random.default_rng(6)
    keys = key_values(rng, 12, tf.string)
    original = _checkpointed_embedding(capacity=16)
    train(original, random_batches(rng, 4, 8, keys), "ragged", tf.string)
    held = len(original.export_dynamic_table("items")[0])
    assert held > 3
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    small = _checkpointed_embedding(capacity=3)
    train(small, random_batches(rng, 2, 8, keys[:3]), "ragged", tf.string)
    before = small.dynamic_tables.logical_state("items")
    with pytest.raises(ValueError, match=f"table 'items'.*holds {held} keys, more than its "
                                         "capacity of 3"):
        tf.train.Checkpoint(embedding=small).restore(path)
    after = small.dynamic_tables.logical_state("items")
    for kind in before:
        np.testing.assert_array_equal(after[kind], before[kind])


def _two_dynamic_tables_and_a_fixed_one(small=None, fixed_rows=16):
    """An embedding with dynamic tables "a" and "b" (capacity 16, or 3 for the one named
    `small`) and a fixed table "c"; feature fa, fb, fc read them."""
    tables = {name: E.TableConfig(vocabulary_size=3 if name == small else 16, dim=DIM,
                                  name=name, initializer=tf.constant_initializer(0.25))
              for name in ("a", "b")}
    tables["c"] = E.TableConfig(vocabulary_size=fixed_rows, dim=DIM, name="c")
    return sce.TPUEmbeddingV2(
        {f"f{name}": E.FeatureConfig(table=table, name=f"f{name}")
         for name, table in tables.items()},
        optimizer=E.Adagrad(0.1), dynamic_vocabularies={
            name: sce.DynamicVocabulary(key_dtype=tf.int64) for name in ("a", "b")})


def _train_three_tables(embedding, rng, steps=3, keys=12):
    @tf.function
    def step(features):
        activations, preserved = embedding(features)
        gradients = {k: ph.LOSS_SCALE * a + 0.5 for k, a in activations.items()}
        return embedding.apply_gradients(gradients, preserved)

    for _ in range(steps):
        step({name: tf.ragged.constant([list(rng.integers(0, keys, 2)) for _ in range(8)],
                                       tf.int64) for name in ("fa", "fb", "fc")})


def _whole_state(embedding):
    """Every table's state: the dynamic tables' logical states and the fixed table's values."""
    state = {f"{name}/{part}": value for name in ("a", "b")
             for part, value in embedding.dynamic_tables.logical_state(name).items()}
    state["c"] = np.array(embedding.embedding_tables[embedding.tables.config("c")])
    return state


@pytest.mark.parametrize("failing", ["a", "b", "c"])
def test_a_checkpoint_table_that_does_not_fit_leaves_every_table_as_it_was(tmp_path, failing):
    """Whichever table of a checkpoint fails its checks (a dynamic table with more keys than its
    capacity, a fixed table of another size), no table is restored: the dynamic tables are
    checked and held by their nodes and imported only once the whole checkpoint passed. A good
    checkpoint then restores whole, as if the failed restore never happened."""
    rng = np.random.default_rng(11)
    original = _two_dynamic_tables_and_a_fixed_one()
    _train_three_tables(original, rng)
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    target = (_two_dynamic_tables_and_a_fixed_one(fixed_rows=12) if failing == "c" else
              _two_dynamic_tables_and_a_fixed_one(small=failing))
    _train_three_tables(target, rng, keys=3)
    before = _whole_state(target)
    match = (f"table '{failing}'.*more than its capacity of 3" if failing != "c"
             else "table 'c'")
    with pytest.raises(ValueError, match=match):
        tf.train.Checkpoint(embedding=target).restore(path)
    after = _whole_state(target)
    assert sorted(after) == sorted(before)
    for part in before:
        np.testing.assert_array_equal(after[part], before[part], err_msg=part)

    good = (_two_dynamic_tables_and_a_fixed_one(fixed_rows=12) if failing == "c" else
            _two_dynamic_tables_and_a_fixed_one(small=failing))
    _train_three_tables(good, rng, keys=3)
    good_path = tf.train.Checkpoint(embedding=good).save(str(tmp_path / "good"))
    tf.train.Checkpoint(embedding=target).restore(good_path)
    restored, want = _whole_state(target), _whole_state(good)
    for part in want:
        np.testing.assert_array_equal(restored[part], want[part], err_msg=part)


def test_a_restore_that_fails_elsewhere_leaves_nothing_for_a_later_restore(tmp_path):
    """A restore that fails after a dynamic table's node held its state (here on another
    object of the checkpoint) imports nothing, and a later restore of another checkpoint does
    not import the held state either."""
    rng = np.random.default_rng(12)
    original = _two_dynamic_tables_and_a_fixed_one()
    _train_three_tables(original, rng)
    path = tf.train.Checkpoint(embedding=original, v=tf.Variable([1.0, 2.0])).save(
        str(tmp_path / "ckpt"))
    target = _two_dynamic_tables_and_a_fixed_one()
    _train_three_tables(target, rng, keys=3)
    before = _whole_state(target)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        tf.train.Checkpoint(embedding=target, v=tf.Variable([0.0, 0.0, 0.0])).restore(path)
    fixed_only = sce.TPUEmbeddingV2(
        {"fc": E.FeatureConfig(table=E.TableConfig(vocabulary_size=16, dim=DIM, name="c"),
                               name="fc")}, optimizer=E.Adagrad(0.1))
    fixed_only.build(per_replica_batch_size=8)
    other = tf.train.Checkpoint(embedding=fixed_only).save(str(tmp_path / "fixed"))
    tf.train.Checkpoint(embedding=target).restore(other)
    after = _whole_state(target)
    for part in before:
        if part != "c":   # the fixed table is restored from the second checkpoint
            np.testing.assert_array_equal(after[part], before[part], err_msg=part)
    np.testing.assert_array_equal(
        after["c"], np.array(fixed_only.embedding_tables[fixed_only.tables.config("c")]))


def keras_model(batch=8, strategy=None, pipelined=False):
    """(model, its EmbeddingLayer): string keys through a dynamic table with threshold 2."""
    import keras   # noqa: PLC0415
    with (strategy or tf.distribute.get_strategy()).scope():
        words = E.TableConfig(vocabulary_size=16, dim=DIM, name="words", combiner="sum",
                              initializer=tf.constant_initializer(0.1))
        layer = sce.EmbeddingLayer({"w": E.FeatureConfig(table=words, name="w")},
                                   optimizer=E.SGD(0.5), batch_size=batch,
                                   pipeline_execution_with_tensor_core=pipelined,
                                   dynamic_vocabularies={"words": sce.DynamicVocabulary(
                                       tf.string, admission_threshold=2)})
        inputs = keras.Input(shape=(), dtype="string", name="w", batch_size=batch)
        model = keras.Model(inputs, keras.layers.Dense(
            1, kernel_initializer="ones")(layer({"w": inputs})["w"]))
        model.compile(optimizer="sgd", loss="mse")
    return model, layer


@pytest.mark.parametrize("pipelined", [False, True])
def test_keras_fit_admits_keys_and_predict_evaluate_only_read_them(tmp_path, pipelined):
    """fit trains string keys through a dynamic table; predict and evaluate read it without
    admitting or counting keys (unknown keys read zeros); a weights file restores the state.
    Pipelined, predict first applies the update the last training step kept."""
    rng = np.random.default_rng(4)
    keys = np.array([b"k%d" % i for i in rng.integers(0, 6, 64)], dtype=object)
    labels = rng.normal(size=(64, 1)).astype(np.float32)
    model, layer = keras_model(pipelined=pipelined)
    model.fit(tf.data.Dataset.from_tensor_slices((keys, labels)).batch(8), epochs=2, verbose=0)
    held = sorted(set(keys.tolist()))   # every key is seen at least twice: all are admitted
    query = np.array([held[0], b"unknown", held[1], b"unknown", b"other", held[0], b"x", b"y"],
                     dtype=object)
    queries = tf.data.Dataset.from_tensor_slices(query).batch(8)
    predicted = model.predict(queries, verbose=0)   # before any read of the tables
    exported, values = layer.embedding.export_dynamic_table("words")
    assert list(exported) == held
    before = layer.embedding.dynamic_tables.logical_state("words")
    model.predict(queries, verbose=0)
    model.evaluate(tf.data.Dataset.from_tensor_slices((query, labels[:8])).batch(8), verbose=0)
    after = layer.embedding.dynamic_tables.logical_state("words")
    for part in before:
        np.testing.assert_array_equal(after[part], before[part], err_msg=part)
    kernel, bias = model.layers[-1].kernel.numpy(), model.layers[-1].bias.numpy()
    np.testing.assert_allclose(predicted[[1, 3, 4, 6, 7], 0], bias[0], rtol=0, atol=0)
    np.testing.assert_allclose(predicted[[0, 5]], values[[0, 0]] @ kernel + bias, rtol=1e-6)

    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    fresh, fresh_layer = keras_model(pipelined=pipelined)
    fresh.load_weights(path)
    for part, value in layer.embedding.dynamic_tables.logical_state("words").items():
        np.testing.assert_array_equal(
            fresh_layer.embedding.dynamic_tables.logical_state("words")[part], value,
            err_msg=part)
    np.testing.assert_array_equal(fresh.predict(queries, verbose=0), predicted)


def test_save_before_build_restores(tmp_path):
    """An embedding saved before any step (empty maps) restores into a fresh one."""
    original = _checkpointed_embedding()
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "empty"))
    restored = _checkpointed_embedding()
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    restored.build(per_replica_batch_size=8)
    assert len(restored.export_dynamic_table("items")[0]) == 0


@pytest.mark.parametrize("change,error,match", [
    (dict(steps_to_live=1), ValueError,
     "table 'items': the checkpoint .*unseen for more than this table's steps_to_live=1"),
    (dict(steps_to_live=2, admission_threshold=1), ValueError,
     "table 'items': the checkpoint .*admission_threshold of 1 keeps none"),
    # TensorFlow's own read fails first, naming the table's key tensor.
    (dict(steps_to_live=2, key_dtype=tf.int64), tf.errors.InvalidArgumentError,
     "items/.ATTRIBUTES/keys; expected dtype int64 does not equal original dtype string"),
])
def test_restore_checks_the_configuration_first(tmp_path, change, error, match):
    """A state this configuration cannot hold fails naming the table, before the map or any row
    changes."""
    rng = np.random.default_rng(8)
    keys = key_values(rng, 10, tf.string)
    original = _checkpointed_embedding()
    batches = random_batches(rng, 4, 8, keys)
    batches.append({f: [[b"late"]] * 8 for f in OFFSETS})   # older keys unseen for a step
    batches.append({f: [[b"later"]] * 7 + [[b"once " + f.encode()]] for f in OFFSETS})
    train(original, batches, "ragged", tf.string)
    assert len(original.dynamic_tables.logical_state("items")["pending_keys"]) == 2
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    vocabulary = dict(key_dtype=tf.string, admission_threshold=2, steps_to_live=2)
    vocabulary.update(change)
    table = E.TableConfig(vocabulary_size=16, dim=DIM, name="items", combiner="mean",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1))
    other = make_embedding(table, ph.make_optimizer("adagrad"), dynamic_vocabularies={
        "items": sce.DynamicVocabulary(**vocabulary)})
    dtype = vocabulary["key_dtype"]
    train(other, [{f: [[key_values(rng, 1, dtype)[0]]] * 8 for f in OFFSETS}], "ragged", dtype)
    before = other.dynamic_tables.logical_state("items")
    with pytest.raises(error, match=match):
        tf.train.Checkpoint(embedding=other).restore(path)
    after = other.dynamic_tables.logical_state("items")
    for part in before:
        np.testing.assert_array_equal(after[part], before[part])


def test_options_with_numpy_integers_hash_and_serialize():
    options = sce.EmbeddingOptions(replication_threshold_bytes=np.int64(8), dynamic_vocabularies={
        "t": sce.DynamicVocabulary(steps_to_live=np.int64(3), pending_capacity=np.int32(5))})
    assert hash(options) == hash(sce.EmbeddingOptions.from_config(options.to_config()))
    assert options.to_config()["dynamic_vocabularies"]["t"]["steps_to_live"] == 3


@pytest.mark.parametrize("training", [True, False])
def test_rows_of_an_aborted_step_are_reset_by_the_next_lookup(training):
    """A step aborted between its mapping and its row writes (simulated: keys mapped by the map
    alone) leaves its rows listed; the next lookup resets them before reading."""
    from tf_sc_embedding.ops.assign_rows import assign_rows   # noqa: PLC0415
    from tf_sc_embedding.tables.table_storage import PARAMETERS   # noqa: PLC0415
    embedding = make_embedding(
        E.TableConfig(vocabulary_size=8, dim=DIM, name="items", combiner="sum",
                      initializer=tf.constant_initializer(0.5)), E.SGD(0.0), names=("f1",),
        dynamic_vocabularies={"items": sce.DynamicVocabulary()})
    embedding.build(per_replica_batch_size=4)
    stacked = embedding.plan.dynamic.stacked_tables
    name = next(iter(stacked))
    variable = embedding.storage.stacked_variables()[name][PARAMETERS].shard(0)
    _, rows = embedding.storage.storage_rows("items", tf.range(9))
    assign_rows(variable, rows, tf.fill([9, DIM], 9.0), "items")   # an old key's leftovers
    table = embedding.dynamic_tables.table("items")
    table.map.map_step(tf.constant([11, 12], tf.int64), 0)   # mapped, never written
    assert table.map.rows_to_reset().rows.numpy().size == 2
    activations, _ = embedding.embedding_lookup(
        {"f1": tf.ragged.constant([[11], [12], [11], []], tf.int64)}, training=training)
    np.testing.assert_array_equal(activations["f1"].numpy()[:3], 0.5)
    assert table.map.rows_to_reset().rows.numpy().size == 0
