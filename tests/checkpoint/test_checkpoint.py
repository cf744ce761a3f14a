"""Topology-independent checkpoints: keys, restore across replica counts and stacking, deferred
restoration, shape errors, exact resume in a fresh process."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.checkpoint import ckpt_lib
from tests.devices import require_replicas
import tf_sc_embedding as sce
from tf_sc_embedding.saving import checkpointing
from tf_sc_embedding.tables import table_storage as sharded_tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLICA_COUNTS = (1, 2, 4, 8)


def assert_states_equal(expected, actual, exact=True):
    assert sorted(expected) == sorted(actual)
    for key in expected:
        if exact:
            np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)
        else:
            np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5, atol=1e-5,
                                       err_msg=key)


def trained(replicas, stacking=True, steps=2, optimizer="adagrad"):
    strategy, embedding = ckpt_lib.make_embedding(replicas, stacking, optimizer)
    ckpt_lib.Trainer(strategy, embedding).run(range(steps))
    return embedding


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints written after 2 training steps, per (replicas, stacking)."""
    cache = {}

    def get(replicas, stacking=True):
        if (replicas, stacking) not in cache:
            embedding = trained(replicas, stacking)
            directory = tmp_path_factory.mktemp(f"ckpt_{replicas}_{int(stacking)}")
            path = tf.train.Checkpoint(embedding=embedding).save(str(directory / "ckpt"))
            cache[(replicas, stacking)] = (path, ckpt_lib.state(embedding))
        return cache[(replicas, stacking)]
    return get


# ------------------------------------------------------------------------------------- contents
def test_keys_are_logical_tables_and_slots_with_stable_names(saved):
    require_replicas(4)
    keys = {}
    for replicas, stacking in [(1, True), (4, False)]:
        path, state = saved(replicas, stacking)
        shapes = dict(tf.train.list_variables(path))
        keys[(replicas, stacking)] = set(shapes) - {"_CHECKPOINTABLE_OBJECT_GRAPH",
                                                    "save_counter/.ATTRIBUTES/VARIABLE_VALUE"}
        for table in ckpt_lib.VOCAB:
            for kind, key in [("parameters", f"embedding/{table}/.ATTRIBUTES/VARIABLE_VALUE"),
                              ("accumulators",
                               f"embedding/{table}.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE")]:
                assert shapes[key] == [ckpt_lib.VOCAB[table], ckpt_lib.DIM[table]]
                # The saved value IS the logical table (plain TensorFlow reader).
                np.testing.assert_array_equal(tf.train.load_checkpoint(path).get_tensor(key),
                                              state[f"{table}/{kind}"])
    assert keys[(1, True)] == keys[(4, False)]           # no replica- or stacking-dependent keys
    assert not any("replica" in k or "_video" in k.split("/")[1] for k in keys[(1, True)])


def test_layout_is_saved_for_inspection(saved):
    require_replicas(4)
    path, _ = saved(4, False)
    layouts = checkpointing.read_saved_layouts(path)
    video = layouts["embedding/video"]
    assert video["num_replicas"] == 4 and video["num_sparse_cores"] == 16
    assert video["stacked_table"] == "video" and video["vocabulary_size"] == 100
    assert video["kinds"] == ["parameters", "accumulators"] and video["built"]
    assert video["placement"] == "sharded" and video["job_replicas"] == 4
    path, _ = saved(1, True)
    assert checkpointing.read_saved_layouts(path)["embedding/user"]["stacked_table"] != "user"


def test_layout_record_marks_replicated_tables(tmp_path):
    require_replicas(2)
    _, embedding = ckpt_lib.make_embedding(2, False, replicated=("user",))
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    layouts = checkpointing.read_saved_layouts(path)
    user, video = layouts["embedding/user"], layouts["embedding/video"]
    assert (user["placement"], user["num_replicas"], user["job_replicas"]) == ("replicated", 1, 2)
    assert user["num_sparse_cores"] == user["sparse_cores_per_replica"]
    assert (video["placement"], video["num_replicas"], video["job_replicas"]) == ("sharded", 2, 2)


# ------------------------------------------------------------------------------------- restore
def restore_and_compare(saved, source, target, built):
    require_replicas(source[0], target[0])
    path, expected = saved(*source)
    _, embedding = ckpt_lib.make_embedding(target[0], target[1], build=built)
    status = tf.train.Checkpoint(embedding=embedding).restore(path)
    if not built:
        embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // target[0])
    status.assert_consumed()
    assert_states_equal(expected, ckpt_lib.state(embedding))


REPRESENTATIVE = [((1, True), (2, True)), ((2, True), (8, True)), ((8, True), (1, True)),
                  ((4, True), (2, True)), ((2, True), (2, False)), ((4, False), (1, True))]


@pytest.mark.parametrize("source,target", REPRESENTATIVE)
@pytest.mark.parametrize("built", [True, False], ids=["built", "deferred"])
def test_restore_across_topologies(saved, source, target, built):
    restore_and_compare(saved, source, target, built)


@pytest.mark.slow
@pytest.mark.parametrize("source,target", [
    ((a, sa), (b, sb)) for a, b in itertools.product(REPLICA_COUNTS, repeat=2)
    for sa, sb in [(True, True), (True, False), (False, True)]])
@pytest.mark.parametrize("built", [True, False], ids=["built", "deferred"])
def test_restore_every_replica_pair(saved, source, target, built):
    restore_and_compare(saved, source, target, built)


@pytest.mark.parametrize("save_chunk,restore_chunk", [(64, 64), (64, 48)])
@pytest.mark.parametrize("built", [True, False], ids=["built", "deferred"])
def test_tall_tables_are_saved_in_row_slices(tmp_path, monkeypatch, save_chunk, restore_chunk,
                                             built):
    """Tables taller than a restore chunk are stored as row slices of that many rows (TensorFlow
    loads a whole stored slice for any read of it), still one logical tensor to every reader."""
    require_replicas(2)
    monkeypatch.setattr(sharded_tables, "LOGICAL_CHUNK_ROWS", save_chunk)
    embedding = trained(2)
    expected = ckpt_lib.state(embedding)
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    entries = tf.compat.v1.train.NewCheckpointReader(path).debug_string().decode("latin-1")
    dim = ckpt_lib.DIM["item"]
    # "item" (1000 rows): 15 slices of 64 rows and one of 40, for its parameters and accumulator.
    assert entries.count(f"[{save_chunk},{dim}]") == 2 * 15
    assert entries.count(f"[{1000 % save_chunk},{dim}]") == 2
    assert f"[{ckpt_lib.VOCAB['user']},{ckpt_lib.DIM['user']}]" in entries   # short: one piece
    key = "embedding/item/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(tf.train.load_checkpoint(path).get_tensor(key),
                                  expected["item/parameters"])
    monkeypatch.setattr(sharded_tables, "LOGICAL_CHUNK_ROWS", restore_chunk)
    reads = []
    original_read = checkpointing.CheckpointRows.__call__

    def recording_read(self, first, stop):
        reads.append((self.key, first, stop))
        return original_read(self, first, stop)
    monkeypatch.setattr(checkpointing.CheckpointRows, "__call__", recording_read)
    _, restored = ckpt_lib.make_embedding(1, build=built)
    status = tf.train.Checkpoint(embedding=restored).restore(path)
    if not built:
        restored.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH)
    status.assert_consumed()
    assert_states_equal(expected, ckpt_lib.state(restored))
    # Before any row is written, one row of every stored piece is read, so that a corrupted
    # piece anywhere fails the restore with nothing written (TensorFlow checks a piece's checksum
    # when it loads it); then the table is read in chunks.
    item = [(first, stop) for k, first, stop in reads if k == key]
    pieces = [(first, first + 1) for first in range(0, 1000, restore_chunk)]
    assert item[:len(pieces)] == pieces
    assert item[len(pieces):] == [(first, min(1000, first + restore_chunk))
                                  for first in range(0, 1000, restore_chunk)]


@pytest.mark.parametrize("chunk", [1 << 20, 8], ids=["whole", "row_slices"])
def test_checkpoint_written_inside_tf_function(tmp_path, monkeypatch, chunk):
    """In a graph, TensorFlow merges the part files after the save function's returned prefixes:
    they must wait for the writes."""
    monkeypatch.setattr(sharded_tables, "LOGICAL_CHUNK_ROWS", chunk)
    _, embedding = ckpt_lib.make_embedding(1)
    expected = ckpt_lib.state(embedding)
    checkpoint = tf.train.Checkpoint(embedding=embedding)
    write = tf.function(lambda: checkpoint.write(str(tmp_path / "g")))
    for _ in range(2):
        write()
        assert_states_equal(expected, {
            f"{t}/parameters": tf.train.load_variable(
                str(tmp_path / "g"), f"embedding/{t}/.ATTRIBUTES/VARIABLE_VALUE")
            for t in ckpt_lib.VOCAB} | {k: v for k, v in expected.items()
                                        if not k.endswith("/parameters")})


def test_deferred_restore_never_runs_the_initializers(saved, monkeypatch):
    require_replicas(2)
    path, expected = saved(2, True)
    calls = []

    class CountingInitializer(tf.keras.initializers.Initializer):
        def __call__(self, shape, dtype=None, **kwargs):
            calls.append(shape)
            return tf.zeros(shape, dtype)

    _, embedding = ckpt_lib.make_embedding(4, False, build=False,
                                           initializer=lambda name: CountingInitializer())
    tf.train.Checkpoint(embedding=embedding).restore(path).assert_consumed()
    original = sharded_tables._initial_rows
    monkeypatch.setattr(sharded_tables, "_initial_rows",
                        lambda *a, **k: calls.append(a) or original(*a, **k))
    embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // 4)
    assert calls == []                                 # no table or slot initializer ran
    assert_states_equal(expected, ckpt_lib.state(embedding))


def test_restore_before_the_embedding_is_attached(saved):
    """TensorFlow's own deferral: the embedding is created after restore() on its parent."""
    require_replicas(2)
    path, expected = saved(2, True)
    root = tf.train.Checkpoint()
    status = root.restore(path)
    _, embedding = ckpt_lib.make_embedding(1, True, build=False)
    root.embedding = embedding
    embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH)
    status.assert_consumed()
    assert_states_equal(expected, ckpt_lib.state(embedding))


def test_saving_a_restored_but_unbuilt_embedding_keeps_the_values(saved, tmp_path):
    require_replicas(2)
    path, expected = saved(2, True)
    _, unbuilt = ckpt_lib.make_embedding(2, True, build=False)
    tf.train.Checkpoint(embedding=unbuilt).restore(path)
    second = tf.train.Checkpoint(embedding=unbuilt).save(str(tmp_path / "again"))
    _, embedding = ckpt_lib.make_embedding(1, False)
    tf.train.Checkpoint(embedding=embedding).restore(second).assert_consumed()
    assert_states_equal(expected, ckpt_lib.state(embedding))


def test_unbuilt_embedding_without_values_saves_only_its_layout(tmp_path):
    _, unbuilt = ckpt_lib.make_embedding(1, True, build=False)
    path = tf.train.Checkpoint(embedding=unbuilt).save(str(tmp_path / "empty"))
    assert not checkpointing.read_saved_layouts(path)["embedding/video"]["built"]
    _, embedding = ckpt_lib.make_embedding(1, True)
    before = ckpt_lib.state(embedding)
    tf.train.Checkpoint(embedding=embedding).restore(path)
    assert_states_equal(before, ckpt_lib.state(embedding))


@pytest.mark.parametrize("change", [{"vocab": {"user": 34}}, {"dim": {"item": 16}}])
@pytest.mark.parametrize("built", [True, False], ids=["built", "deferred"])
def test_shape_mismatch_fails_naming_the_table(saved, change, built):
    path, _ = saved(1, True)
    _, embedding = ckpt_lib.make_embedding(1, True, build=built, **change)
    before = ckpt_lib.state(embedding) if built else None
    table = next(iter(next(iter(change.values()))))
    with pytest.raises(ValueError, match=f"table '{table}'.*cannot be restored"):
        tf.train.Checkpoint(embedding=embedding).restore(path)
    if built:   # all tables are validated before any is written
        assert_states_equal(before, ckpt_lib.state(embedding))


def test_checkpoint_next_to_dense_model_and_optimizer(tmp_path):
    strategy, embedding = ckpt_lib.make_embedding(1, True)
    ckpt_lib.Trainer(strategy, embedding).run(range(1))
    dense = tf.keras.layers.Dense(3)
    dense.build([None, 4])
    optimizer = tf.keras.optimizers.Adam(0.01)
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in dense.trainable_variables])
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=dense, optimizer=optimizer, embedding=embedding),
        str(tmp_path), max_to_keep=2)
    manager.save()
    expected, kernel = ckpt_lib.state(embedding), dense.kernel.numpy()

    _, embedding2 = ckpt_lib.make_embedding(1, False, build=False)
    dense2 = tf.keras.layers.Dense(3)
    dense2.build([None, 4])
    optimizer2 = tf.keras.optimizers.Adam(0.01)
    optimizer2.build(dense2.trainable_variables)
    status = tf.train.Checkpoint(model=dense2, optimizer=optimizer2, embedding=embedding2).restore(
        manager.latest_checkpoint)
    embedding2.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH)
    status.assert_existing_objects_matched()
    np.testing.assert_array_equal(dense2.kernel.numpy(), kernel)
    assert int(optimizer2.iterations.numpy()) == 1
    assert_states_equal(expected, ckpt_lib.state(embedding2))


def test_restore_into_a_trained_embedding_rolls_it_back(saved):
    strategy, embedding = ckpt_lib.make_embedding(1, True)
    path, expected = saved(1, True)
    ckpt_lib.Trainer(strategy, embedding).run(range(5))
    tf.train.Checkpoint(embedding=embedding).restore(path).assert_consumed()
    assert_states_equal(expected, ckpt_lib.state(embedding))


def test_logical_tables_accessor():
    _, embedding = ckpt_lib.make_embedding(1, True)
    tables = embedding.logical_tables()
    tensors = embedding.logical_tables(include_slots=True, as_numpy=False)
    for name, table in tables.items():
        assert isinstance(table, np.ndarray)
        assert table.shape == (ckpt_lib.VOCAB[name], ckpt_lib.DIM[name])
        assert isinstance(tensors[name]["parameters"], tf.Tensor)
        np.testing.assert_array_equal(tensors[name]["parameters"].numpy(), table)
        np.testing.assert_array_equal(tensors[name]["accumulators"].numpy(), np.float32(0.1))
    by_config = {c.name: t for c, t in embedding.embedding_tables.items()}
    for name in tables:
        np.testing.assert_array_equal(by_config[name], tables[name])


# ------------------------------------------------------------------------------------- resume
RESUME_CASES = [(2, True, 2, True)]
SLOW_RESUME_CASES = [(2, True, 4, False), (1, True, 8, True), (8, True, 1, False),
                     (4, False, 2, True)]


def run_resume(tmp_path, first, then, k=3, m=3, optimizer="adagrad"):
    (n1, s1), (n2, s2) = first, then
    require_replicas(n1, n2)
    strategy, embedding = ckpt_lib.make_embedding(n1, s1, optimizer)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    trainer.run(range(k))
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    at_save = ckpt_lib.state(embedding)
    out = str(tmp_path / "resumed.npz")
    subprocess.run([sys.executable, "-m", "tests.checkpoint.worker", "resume", path, str(n2),
                    str(int(s2)), str(k), str(m), out], check=True, timeout=300, cwd=ROOT)
    # Restoring is bit-exact on any topology.
    assert_states_equal(at_save, ckpt_lib.load_state(out + ".restored.npz"))
    # Uninterrupted reference: k + m steps. The library's training is bit-exact for a fixed replica
    # count; across replica counts cross-replica sums round differently (~1e-6), checkpoint or not.
    strategy, reference = ckpt_lib.make_embedding(n2, s2, optimizer)
    ckpt_lib.Trainer(strategy, reference).run(range(k + m))
    if n1 != n2:
        strategy, reference_n1 = ckpt_lib.make_embedding(n1, s1, optimizer)
        ckpt_lib.Trainer(strategy, reference_n1).run(range(k + m))
        assert_states_equal(ckpt_lib.state(reference_n1), ckpt_lib.load_state(out), exact=False)
    assert_states_equal(ckpt_lib.state(reference), ckpt_lib.load_state(out), exact=n1 == n2)


@pytest.mark.slow   # a fresh process per case; restores across topologies stay in the default run
@pytest.mark.parametrize("n1,s1,n2,s2", RESUME_CASES)
def test_resume_in_a_fresh_process_is_exact(tmp_path, n1, s1, n2, s2):
    run_resume(tmp_path, (n1, s1), (n2, s2))


@pytest.mark.slow
@pytest.mark.parametrize("n1,s1,n2,s2", SLOW_RESUME_CASES)
def test_resume_in_a_fresh_process_other_topologies(tmp_path, n1, s1, n2, s2):
    run_resume(tmp_path, (n1, s1), (n2, s2))


# ------------------------------------------------------------------------------------- placement
ALL_TABLES = ("video", "user", "item")


@pytest.mark.parametrize("source,target", [
    ((2, ALL_TABLES), (4, ())), ((4, ()), (2, ALL_TABLES)), ((2, ("user",)), (1, ())),
    ((1, ()), (2, ("video", "item")))], ids=["replicated-sharded", "sharded-replicated",
                                             "mixed-one", "one-mixed"])
def test_replicated_tables_checkpoint_like_sharded_ones(tmp_path, source, target):
    """The checkpoint of a replicated table is its logical table too: it restores into any
    placement and replica count, before build."""
    require_replicas(source[0], target[0])
    strategy, embedding = ckpt_lib.make_embedding(source[0], replicated=source[1])
    ckpt_lib.Trainer(strategy, embedding).run(range(2))
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    _, restored = ckpt_lib.make_embedding(target[0], build=False, replicated=target[1])
    status = tf.train.Checkpoint(embedding=restored).restore(path)
    restored.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // target[0])
    status.assert_consumed()
    assert_states_equal(ckpt_lib.state(embedding), ckpt_lib.state(restored))


# ------------------------------------------------------------------------------------- bad files
def _saved_after_training(tmp_path, optimizer):
    strategy, embedding = ckpt_lib.make_embedding(1, optimizer=optimizer)
    ckpt_lib.Trainer(strategy, embedding).run(range(1))
    return tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt")), embedding


def test_missing_optimizer_slots_fail_and_write_nothing_unless_allowed(tmp_path):
    path, saved = _saved_after_training(tmp_path, "sgd")      # no slots
    _, embedding = ckpt_lib.make_embedding(1, optimizer="adagrad")
    before = ckpt_lib.state(embedding)
    with pytest.raises(ValueError, match=r"table '\w+'.*no 'accumulators' slot.*"
                                         r"allow_optimizer_change"):
        tf.train.Checkpoint(embedding=embedding).restore(path)
    assert_states_equal(before, ckpt_lib.state(embedding))
    with checkpointing.allow_optimizer_change():
        tf.train.Checkpoint(embedding=embedding).restore(path).expect_partial()
    after = ckpt_lib.state(embedding)
    for key, value in ckpt_lib.state(saved).items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    for key in after:   # slots the checkpoint lacks keep their initial values
        if key.endswith("accumulators"):
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_truncated_data_file_fails_naming_the_table_and_writes_nothing(tmp_path):
    path, _ = _saved_after_training(tmp_path, "adagrad")
    data = sorted(tmp_path.glob("ckpt-1.data-*"))
    assert data
    largest = max(data, key=lambda p: p.stat().st_size)
    content = largest.read_bytes()
    largest.write_bytes(content[:len(content) // 3])
    _, embedding = ckpt_lib.make_embedding(1)
    before = ckpt_lib.state(embedding)
    with pytest.raises((ValueError, tf.errors.OpError), match=r"table '\w+'|truncated|corrupt"):
        tf.train.Checkpoint(embedding=embedding).restore(path)
    assert_states_equal(before, ckpt_lib.state(embedding))
