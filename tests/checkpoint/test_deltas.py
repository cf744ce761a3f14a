"""Delta exports (docs/deltas.md): a checkpoint plus the deltas after it restore, in any replica
count, exactly what a checkpoint at the last delta holds; broken chains and files fail naming
the file, with nothing applied."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests import devices
from tests.checkpoint import ckpt_lib
from tf_sc_embedding.deltas import delta_format as fmt

E = tf.tpu.experimental.embedding


def make(replicas, optimizer="adagrad", dtypes=None, build=True):
    tables = ckpt_lib.table_configs()
    features = {f: E.FeatureConfig(table=tables[t], name=f)
                for f, t in ckpt_lib.FEATURES.items()}
    strategy = ckpt_lib.make_strategy(replicas)
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, ckpt_lib.make_optimizer(optimizer),
                                       delta_tracking=True, table_dtypes=dtypes or {})
    if build:
        embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // replicas)
    return strategy, embedding


def full_state(embedding):
    return dict(ckpt_lib.state(embedding), update_step=np.array(embedding.update_step()))


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def train_with_deltas(tmp_path, optimizer="adagrad", dtypes=None, replicas=1):
    """Trains 7 steps: checkpoint after step 2, deltas after steps 3, 5 and 7, and a checkpoint
    after step 7. Returns (checkpoint at 2, [delta paths], checkpoint at 7, state at 7)."""
    strategy, embedding = make(replicas, optimizer, dtypes)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    checkpoint = tf.train.Checkpoint(embedding=embedding)
    trainer.run(range(2))
    early = checkpoint.save(str(tmp_path / "ckpt" / "early"))
    deltas = []
    for steps in (range(2, 3), range(3, 5), range(5, 7)):
        trainer.run(steps)
        deltas.append(embedding.export_delta(tmp_path / "deltas", include_optimizer_state=True))
    late = checkpoint.save(str(tmp_path / "ckpt" / "late"))
    return early, deltas, late, full_state(embedding)


def restored(path, replicas, optimizer="adagrad", dtypes=None):
    strategy, embedding = make(replicas, optimizer, dtypes)
    tf.train.Checkpoint(embedding=embedding).restore(path).assert_consumed()
    return strategy, embedding


SIXTEEN_BIT = {"item": "bfloat16", "user": "float16"}
# The default run keeps one float32 and one 16-bit case; the slow run has every combination.
RECOVERY_CASES = [pytest.param(o, d, r, marks=() if (o, r) in (("adagrad", 2), ("adam", 1))
                               else pytest.mark.slow)
                  for o, d in (("adagrad", None), ("row_wise_adagrad", None), ("adam", SIXTEEN_BIT))
                  for r in (1, 2, 4)]


@pytest.mark.parametrize("optimizer,dtypes,replicas", RECOVERY_CASES)
def test_checkpoint_plus_deltas_equals_the_later_checkpoint_on_any_replica_count(
        tmp_path, optimizer, dtypes, replicas):
    early, deltas, late, trained = train_with_deltas(tmp_path, optimizer, dtypes)
    _, target = restored(early, replicas, optimizer, dtypes)
    for path in deltas:
        target.apply_delta(path)
    _, reference = restored(late, replicas, optimizer, dtypes)
    assert_same(full_state(target), full_state(reference))
    assert_same(full_state(target), trained)


def test_a_delta_holds_only_the_rows_trained_since_the_previous_one(tmp_path):
    strategy, embedding = make(1)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    trainer.run(range(1))
    before = ckpt_lib.state(embedding)
    embedding.export_delta(tmp_path)
    trainer.run(range(1, 2))
    after = ckpt_lib.state(embedding)
    path = embedding.export_delta(tmp_path)
    (part,) = fmt.read_delta(path)
    for name, table in part.manifest["tables"].items():
        ids = fmt.decode_ids(part.array(f"{name}.ids.npy", np.uint8, (-1,)), table["count"])
        changed = np.flatnonzero(np.any(before[f"{name}/parameters"] !=
                                        after[f"{name}/parameters"], axis=1))
        assert set(changed) <= set(ids)      # every changed row is carried
        np.testing.assert_array_equal(fmt.row_values(part, name, table, len(ids)),
                                      after[f"{name}/parameters"][ids])
        assert table["count"] < table["rows"]
    assert not part.manifest["optimizer_state"]
    assert not [f for f in part.manifest["files"] if "accumulator" in f]


def test_ids_round_trip_through_their_varint_encoding():
    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 1000):
        ids = np.unique(rng.integers(0, 1 << 40, size=n))
        data = fmt.encode_ids(ids)
        np.testing.assert_array_equal(fmt.decode_ids(data, len(ids)), ids)
    dense = np.arange(0, 100000, 3)
    assert len(fmt.encode_ids(dense)) == len(dense)    # one byte per small gap
    with pytest.raises(fmt.DeltaError, match="complete ids"):
        fmt.decode_ids(fmt.encode_ids([5, 700])[:-1], 2)


@pytest.fixture(scope="module")
def trained_chain(tmp_path_factory):
    return train_with_deltas(tmp_path_factory.mktemp("chain"))


@pytest.fixture
def chain(trained_chain, tmp_path):
    """(tmp_path, early checkpoint, copies of the deltas in tmp_path, late checkpoint)."""
    early, deltas, late, _ = trained_chain
    copies = []
    for path in deltas:
        copies.append(str(tmp_path / "deltas" / os.path.basename(path)))
        shutil.copytree(path, copies[-1])
    return tmp_path, early, copies, late


def test_a_broken_chain_fails_naming_the_delta_and_applies_nothing(chain):
    tmp_path, early, deltas, _ = chain
    _, target = restored(early, 1)
    before = full_state(target)
    with pytest.raises(fmt.DeltaError, match=r"delta-00000002.*missing"):
        target.apply_delta(deltas[1])
    assert_same(full_state(target), before)
    target.apply_delta(deltas[0])
    with pytest.raises(fmt.DeltaError, match="already applied"):
        target.apply_delta(deltas[0])
    _, other = restored(early, 1)
    other.apply_delta(deltas[0])
    other.apply_delta(deltas[1])
    # A run continued from the late checkpoint: its first delta applies to that checkpoint only.
    strategy, resumed = restored(chain[3], 1)
    ckpt_lib.Trainer(strategy, resumed).run(range(7, 8))
    fork = resumed.export_delta(tmp_path / "fork", include_optimizer_state=True)
    with pytest.raises(fmt.DeltaError, match="another base"):
        other.apply_delta(fork)


def test_serving_only_deltas_cannot_restore_training(tmp_path):
    strategy, embedding = make(1)
    checkpoint = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
    ckpt_lib.Trainer(strategy, embedding).run(range(1))
    path = embedding.export_delta(tmp_path / "d")
    _, target = restored(checkpoint, 1)
    with pytest.raises(fmt.DeltaError, match="no optimizer state"):
        target.apply_delta(path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "marker", "other_shape"])
def test_a_damaged_delta_fails_naming_the_file_and_applies_nothing(chain, damage):
    tmp_path, early, deltas, _ = chain
    path = deltas[0]
    (part_dir,) = [os.path.join(path, d) for d in os.listdir(path) if not d.endswith(".done")]
    values = os.path.join(part_dir, "item.values.npy")
    if damage == "truncate":
        with open(values, "r+b") as f:
            f.truncate(os.path.getsize(values) - 3)
        expected = "item.values.npy: truncated or corrupted"
    elif damage == "flip":
        with open(values, "r+b") as f:
            f.seek(200)
            byte = f.read(1)
            f.seek(200)
            f.write(bytes([byte[0] ^ 1]))
        expected = "item.values.npy: truncated or corrupted"
    elif damage == "manifest":
        with open(os.path.join(part_dir, "manifest.json"), "a") as f:
            f.write(" ")
        expected = "manifest.json: does not match its done marker"
    elif damage == "marker":
        os.remove(part_dir + ".done")
        expected = "incomplete"
    else:
        strategy, other = make(1, build=False)
        del strategy
        expected = None
    _, target = restored(early, 1)
    before = full_state(target)
    if expected is None:   # an embedding whose tables have other shapes
        tables = ckpt_lib.table_configs(dim={"item": 4})
        features = {f: E.FeatureConfig(table=tables[t], name=f)
                    for f, t in ckpt_lib.FEATURES.items()}
        other = sce.TPUEmbeddingV2(features, ckpt_lib.make_optimizer("adagrad"),
                                   delta_tracking=True)
        other.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH)
        tf.train.Checkpoint(embedding=other).save(str(tmp_path / "o"))
        with pytest.raises(fmt.DeltaError, match="table 'item'"):
            # Its position differs too: give it the chain's so that the shapes are what fails.
            other._deltas.position = fmt.read_delta(path)[0].manifest["previous"]  # pylint: disable=protected-access
            other.apply_delta(path)
        return
    with pytest.raises(fmt.DeltaError, match=expected):
        target.apply_delta(path)
    assert_same(full_state(target), before)


def test_export_without_tracking_fails():
    tables = ckpt_lib.table_configs()
    features = {"f": E.FeatureConfig(table=tables["user"])}
    embedding = sce.TPUEmbeddingV2(features, E.SGD(0.1))
    embedding.build(per_replica_batch_size=4)
    with pytest.raises(ValueError, match="delta_tracking=True"):
        embedding.export_delta("/tmp/never")


def test_a_background_write_returns_a_future(tmp_path):
    strategy, embedding = make(1)
    ckpt_lib.Trainer(strategy, embedding).run(range(1))
    future = embedding.export_delta(tmp_path, blocking=False)
    ckpt_lib.Trainer(strategy, embedding).run(range(1, 2))   # training goes on
    assert fmt.is_complete(future.result(timeout=60))
    assert [s for s, _, _ in fmt.list_deltas(tmp_path)] == [1]


def test_the_format_module_reads_without_tensorflow(tmp_path):
    import subprocess, sys   # pylint: disable=import-outside-toplevel,multiple-imports
    strategy, embedding = make(1)
    ckpt_lib.Trainer(strategy, embedding).run(range(1))
    path = embedding.export_delta(tmp_path)
    source = fmt.__file__
    code = f"""
import importlib.util, sys
sys.modules["tensorflow"] = None   # importing TensorFlow now fails
spec = importlib.util.spec_from_file_location("delta_format", {source!r})
fmt = importlib.util.module_from_spec(spec); spec.loader.exec_module(fmt)
(part,) = fmt.read_delta({path!r})
t = part.manifest["tables"]["item"]
ids = fmt.decode_ids(part.array("item.ids.npy", "uint8", (-1,)), t["count"])
print(len(ids), fmt.row_values(part, "item", t, len(ids)).shape)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert int(out[0]) > 0


def _dynamic_embedding(strategy, key_dtype):
    from tests.api.test_dynamic_vocabulary import make_embedding   # pylint: disable=import-outside-toplevel
    with strategy.scope():
        return make_embedding(
            E.TableConfig(vocabulary_size=24, dim=4, name="items", combiner="mean",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1)),
            ckpt_lib.make_optimizer("adagrad"), delta_tracking=True,
            dynamic_vocabularies={"items": sce.DynamicVocabulary(
                key_dtype=key_dtype, admission_threshold=2, steps_to_live=2,
                pending_capacity=256)})


@pytest.mark.parametrize("key_dtype,source,target", [
    pytest.param(k, s, t, marks=() if (k, s, t) == (tf.string, 1, 2) else pytest.mark.slow)
    for k in (tf.int64, tf.string) for s, t in ((1, 1), (1, 2), (2, 4), (4, 1))])
def test_open_vocabularies_recover_keys_counts_and_evictions_on_any_replica_count(
        tmp_path, key_dtype, source, target):
    from tests.api.test_dynamic_vocabulary import key_values, random_batches, train   # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(source * 10 + target)
    keys = key_values(rng, 40, key_dtype)
    batches = random_batches(rng, 8, 16, keys)
    strategy = ckpt_lib.make_strategy(source)
    original = _dynamic_embedding(strategy, key_dtype)
    checkpoint = tf.train.Checkpoint(embedding=original)
    train(original, batches[:2], "ragged", key_dtype, strategy)
    early = checkpoint.save(str(tmp_path / "early"))
    deltas = []
    for first, stop in ((2, 4), (4, 5), (5, 8)):
        train(original, batches[first:stop], "ragged", key_dtype, strategy)
        deltas.append(original.export_delta(tmp_path / "d", include_optimizer_state=True))
    manifests = [fmt.read_delta(p)[0].manifest["tables"]["items"] for p in deltas]
    assert sum(m["tombstones"] for m in manifests) > 0       # keys were evicted on the way
    want = original.dynamic_tables.logical_state("items")

    strategy = ckpt_lib.make_strategy(target)
    recovered = _dynamic_embedding(strategy, key_dtype)
    recovered.build(per_replica_batch_size=16 // target)
    tf.train.Checkpoint(embedding=recovered).restore(early).assert_consumed()
    for path in deltas:
        recovered.apply_delta(path)
    got = recovered.dynamic_tables.logical_state("items")
    for part, value in want.items():
        np.testing.assert_array_equal(got[part], value, err_msg=part)
    assert recovered.update_step() == original.update_step()


def _serving_inputs(step):
    ids, weights = ckpt_lib.global_batch(step)
    inputs = {}
    for feature in ckpt_lib.FEATURES:
        inputs[f"{feature}_ids"] = ids[feature].values
        inputs[f"{feature}_row_splits"] = ids[feature].row_splits
    return inputs


def _op_types(export_dir):
    from tensorflow.core.protobuf import saved_model_pb2   # pylint: disable=import-outside-toplevel
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return {n.op for meta in proto.meta_graphs for function in meta.graph_def.library.function
            for n in function.node_def}


@pytest.mark.parametrize("quantize", [None, pytest.param("int8", marks=pytest.mark.slow)])
def test_a_live_serving_model_applies_deltas_and_answers_as_a_fresh_export(tmp_path, quantize):
    from tf_sc_embedding.saving import serving   # pylint: disable=import-outside-toplevel
    strategy, embedding = make(1, "adagrad", {"item": "bfloat16"})
    trainer = ckpt_lib.Trainer(strategy, embedding)
    trainer.run(range(1))
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir, quantize=quantize)
    assert not {op for op in _op_types(export_dir) if op.startswith("Sce")}
    live = tf.saved_model.load(export_dir)
    paths = []
    for steps in (range(1, 2), range(2, 4)):
        trainer.run(steps)
        paths.append(embedding.export_delta(tmp_path / "deltas"))
        live.apply_delta(paths[-1])
    fresh = serving.serving_module(embedding, quantize)
    inputs = _serving_inputs(9)
    want = fresh.serving_default(inputs)
    got = live.signatures["serving_default"](**inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
    position = live.delta_position.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not follow"):
        live.apply_delta(paths[0])                # already applied
    assert live.delta_position.numpy() == position


def test_a_damaged_delta_leaves_the_serving_model_as_it_was(tmp_path):
    strategy, embedding = make(1)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir)
    live = tf.saved_model.load(export_dir)
    trainer.run(range(2))
    path = embedding.export_delta(tmp_path / "deltas")
    (part,) = [os.path.join(path, d) for d in os.listdir(path) if not d.endswith(".done")]
    before = {k: v.numpy() for k, v in live.tables.items()}
    values = os.path.join(part, "user.values.npy")
    with open(values, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x00\xc0\x7f")              # a NaN in the last row: another fingerprint
    with pytest.raises(tf.errors.InvalidArgumentError, match="corrupted"):
        live.apply_delta(path)
    for name, value in live.tables.items():
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)


@pytest.mark.slow   # the serving path of open vocabularies is also fuzzed (fuzz/delta_fuzzer.py)
def test_serving_deltas_hold_and_evict_open_vocabulary_keys(tmp_path):
    from tests.api.test_dynamic_vocabulary import key_values, random_batches, train   # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.saving import serving   # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(5)
    keys = key_values(rng, 40, tf.string)
    batches = random_batches(rng, 8, 16, keys)
    embedding = _dynamic_embedding(tf.distribute.get_strategy(), tf.string)
    train(embedding, batches[:2], "ragged", tf.string)
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir)
    live = tf.saved_model.load(export_dir)
    evicted = 0
    for first, stop in ((2, 4), (4, 5), (5, 8)):
        train(embedding, batches[first:stop], "ragged", tf.string)
        path = embedding.export_delta(tmp_path / "d")
        evicted += fmt.read_delta(path)[0].manifest["tables"]["items"]["tombstones"]
        live.apply_delta(path)
    assert evicted
    fresh = serving.serving_module(embedding)
    query = tf.ragged.constant([list(keys[:20]), list(keys[20:]), [b"never seen"]], tf.string)
    inputs = {"f1_ids": query.values, "f1_row_splits": query.row_splits,
              "f2_ids": query.values, "f2_row_splits": query.row_splits}
    want = fresh.serving_default(inputs)
    got = live.signatures["serving_default"](**inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
