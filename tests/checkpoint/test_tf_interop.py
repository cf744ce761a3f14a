"""Checkpoints interoperate with TensorFlow's own CPU class `TPUEmbeddingForServing` (the oracle):
ours restore there, theirs restore here, and checkpoints of earlier versions (keys
`<table>/.ATTRIBUTES/parameters`) still restore."""
import numpy as np
import pytest
import tensorflow as tf

from tests.checkpoint import ckpt_lib
from tests.devices import require_replicas
import tf_sc_embedding as sce
from tf_sc_embedding.saving import checkpointing
from tf_sc_embedding import private_tf

E = tf.tpu.experimental.embedding


def serving_embedding(**table_kwargs):
    tables = ckpt_lib.table_configs(**table_kwargs)
    features = {f: E.FeatureConfig(table=tables[t], name=f)
                for f, t in ckpt_lib.FEATURES.items()}
    return E.TPUEmbeddingForServing(features, ckpt_lib.make_optimizer())


def tf_state(serving):
    return {f"{name}/{kind}": v.numpy() for name, kinds in serving._variables.items()  # noqa: SLF001
            for kind, v in kinds.items()}


@pytest.mark.parametrize("replicas,build_first", [(1, True), (2, False)])
def test_our_checkpoint_restores_into_tensorflow_serving_class(tmp_path, replicas, build_first):
    require_replicas(replicas)
    strategy, embedding = ckpt_lib.make_embedding(replicas)
    ckpt_lib.Trainer(strategy, embedding).run(range(2))
    expected = ckpt_lib.state(embedding)
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ours"))
    keys = dict(tf.train.list_variables(path))
    assert keys["embedding/video/.ATTRIBUTES/VARIABLE_VALUE"] == [100, 10]
    assert keys["embedding/video.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"] == [100, 10]

    serving = serving_embedding(initializer=lambda name: tf.zeros_initializer())
    if build_first:
        serving.build()
    tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
    if not build_first:
        serving.build()   # TensorFlow's deferred restore: the variables are created restored
    got = tf_state(serving)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    # The serving class looks up with the restored tables.
    ids = {f: tf.constant([[1], [2]], tf.int64) for f in ckpt_lib.FEATURES}
    ids = {f: tf.RaggedTensor.from_tensor(v) for f, v in ids.items()}
    out = serving(ids)
    np.testing.assert_allclose(out["f_item"].numpy(), expected["item/parameters"][[1, 2]],
                               rtol=1e-6)


@pytest.mark.parametrize("replicas,built", [(2, True), (1, False)])
def test_tensorflow_checkpoint_restores_here(tmp_path, replicas, built):
    require_replicas(replicas)
    serving = serving_embedding(initializer=lambda name: tf.keras.initializers.RandomUniform(
        -1.0, 1.0, seed=len(name) + 7))
    serving.build()
    for kinds in serving._variables.values():   # noqa: SLF001  (distinct slot values too)
        kinds["accumulators"].assign(kinds["accumulators"] + 0.5)
    expected = tf_state(serving)
    path = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "theirs"))

    strategy, embedding = ckpt_lib.make_embedding(replicas, build=built)
    status = tf.train.Checkpoint(embedding=embedding).restore(path)
    if not built:
        embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // replicas)
    status.assert_existing_objects_matched()
    got = ckpt_lib.state(embedding)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    ckpt_lib.Trainer(strategy, embedding).run([5])   # and trains on


def _write_old_format(path, state, layouts=True):
    """A checkpoint as versions before the TensorFlow key layout wrote it (registered saver on
    each table node, keys `<path>/.ATTRIBUTES/<kind>`)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=import-outside-toplevel
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    root = graph.nodes.add()
    root.children.add(node_id=1, local_name="embedding")
    emb = graph.nodes.add()
    tables = sorted({k.split("/")[0] for k in state})
    names, values = [], []
    for i, table in enumerate(tables):
        emb.children.add(node_id=2 + i, local_name=table)
        node = graph.nodes.add()
        node.registered_saver.name = f"{checkpointing.SAVER_PACKAGE}.{checkpointing.SAVER_NAME}"
        node.registered_saver.object_name = f"embedding/{table}"
        for key, value in state.items():
            if key.startswith(table + "/"):
                names.append(private_tf.checkpoint_key(f"embedding/{table}", key.split("/")[1]))
                values.append(tf.constant(value))
    names.append("_CHECKPOINTABLE_OBJECT_GRAPH")
    values.append(tf.constant(graph.SerializeToString()))
    tf.raw_ops.SaveV2(prefix=path, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=values)
    return path


def test_checkpoint_of_earlier_versions_restores(tmp_path):
    strategy, source = ckpt_lib.make_embedding(1)
    ckpt_lib.Trainer(strategy, source).run(range(2))
    expected = ckpt_lib.state(source)
    path = _write_old_format(str(tmp_path / "old"), expected)
    assert "embedding/video/.ATTRIBUTES/parameters" in dict(tf.train.list_variables(path))
    _, embedding = ckpt_lib.make_embedding(1)
    # The slot nodes of this version have no object in such a checkpoint (the table node held
    # every kind), so only expect_partial() holds; the values, slots included, are restored.
    tf.train.Checkpoint(embedding=embedding).restore(path).expect_partial()
    got = ckpt_lib.state(embedding)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_serving_checkpoint_with_wrong_shape_is_rejected(tmp_path):
    serving = serving_embedding(vocab={"video": 101})
    serving.build()
    path = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "theirs"))
    _, embedding = ckpt_lib.make_embedding(1)
    before = ckpt_lib.state(embedding)
    with pytest.raises(ValueError, match="table 'video'.*101"):
        tf.train.Checkpoint(embedding=embedding).restore(path)
    after = ckpt_lib.state(embedding)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_saving_twice_and_resaving_restored_checkpoint(tmp_path):
    # After a restore the nodes serialize as variables again (no registered saver left on them).
    _, embedding = ckpt_lib.make_embedding(1)
    first = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "a"))
    tf.train.Checkpoint(embedding=embedding).restore(first).assert_consumed()
    second = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "b"))
    assert sorted(dict(tf.train.list_variables(first))) == \
        sorted(dict(tf.train.list_variables(second)))
    serving = serving_embedding()
    tf.train.Checkpoint(embedding=serving).restore(second).expect_partial()
    serving.build()
    np.testing.assert_array_equal(tf_state(serving)["user/parameters"],
                                  ckpt_lib.state(embedding)["user/parameters"])
