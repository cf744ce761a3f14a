"""Full-model `.keras` saving of a model with an EmbeddingLayer: config round trip of TensorFlow's
table, feature, optimizer and SparseCore configs; identical outputs and continued training after
`keras.models.load_model`."""
import numpy as np
import pytest
import tensorflow as tf

import keras

import tf_sc_embedding as sce
from tf_sc_embedding.keras import config as keras_config
from tf_sc_embedding.keras.layer import EmbeddingLayer

E = tf.tpu.experimental.embedding
B = 8
VOCAB, DIM = {"a": 16, "b": 8}, {"a": 4, "b": 2}


def feature_config():
    tables = {
        "a": E.TableConfig(vocabulary_size=16, dim=4, name="t_a", combiner="mean",
                           initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=1),
                           optimizer=E.Adam(learning_rate=0.01, clip_weight_max=5.0)),
        "b": E.TableConfig(vocabulary_size=8, dim=2, name="t_b",
                           initializer=tf.constant_initializer(
                               np.arange(16, dtype=np.float32).reshape(8, 2) / 16))}
    return {"a": E.FeatureConfig(table=tables["a"], name="a"),
            "b": E.FeatureConfig(table=tables["b"], name="b")}


def data(seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "dense":
        ids = {n: rng.integers(0, VOCAB[n], size=(2 * B, 2)).astype(np.int32) for n in VOCAB}
    else:
        ids = {n: tf.ragged.constant([list(rng.integers(0, VOCAB[n], rng.integers(1, 4)))
                                      for _ in range(2 * B)], dtype=tf.int32) for n in VOCAB}
    labels = rng.normal(size=(2 * B, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(B, drop_remainder=True)


def make_model(kind, optimizer="adagrad"):
    """Table "b" trains with the layer's optimizer: Adagrad, or row-wise Adagrad."""
    default = (E.Adagrad(0.2) if optimizer == "adagrad" else
               sce.RowWiseAdagrad(0.2, initial_accumulator_value=0.05, epsilon=1e-6))
    layer = EmbeddingLayer(feature_config(), optimizer=default, batch_size=B,
                           sparse_core_embedding_config=E.SparseCoreEmbeddingConfig(
                               disable_table_stacking=True), name="emb")
    if kind == "dense":
        inputs = {n: keras.Input(shape=(2,), dtype="int32", name=n) for n in VOCAB}
    else:
        inputs = {n: keras.Input(shape=(None,), dtype="int32", ragged=True, name=n)
                  for n in VOCAB}
    acts = layer(inputs)
    x = keras.layers.Concatenate()([keras.layers.Flatten()(acts[n]) for n in VOCAB])
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize("kind,optimizer", [("ragged", "adagrad"), ("dense", "adagrad"),
                                            ("ragged", "row_wise_adagrad")])
def test_save_load_keras_identical_outputs_and_training(tmp_path, kind, optimizer):
    ds = data(1, kind)
    model = make_model(kind, optimizer)
    model.fit(ds, epochs=2, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    layer, layer2 = model.get_layer("emb"), loaded.get_layer("emb")
    assert isinstance(layer2, EmbeddingLayer)
    np.testing.assert_array_equal(loaded.predict(ds, verbose=0), model.predict(ds, verbose=0))
    for name, kinds in layer.embedding.logical_tables(include_slots=True).items():
        got = layer2.embedding.logical_tables(include_slots=True)[name]
        assert sorted(got) == sorted(kinds)
        for kind_name, value in kinds.items():
            np.testing.assert_array_equal(got[kind_name], value, err_msg=f"{name}/{kind_name}")
    model.fit(ds, epochs=1, verbose=0)
    loaded.fit(ds, epochs=1, verbose=0)
    np.testing.assert_allclose(loaded.predict(ds, verbose=0), model.predict(ds, verbose=0),
                               rtol=1e-5, atol=1e-6)
    for name, value in layer.embedding.logical_tables().items():
        np.testing.assert_allclose(layer2.embedding.logical_tables()[name], value, rtol=1e-5,
                                   atol=1e-6)


def test_config_round_trip_of_every_optimizer():
    for optimizer in (E.SGD(0.1, clip_weight_min=-2.0, weight_decay_factor=0.1),
                      E.Adagrad(0.2, initial_accumulator_value=0.3, clipvalue=0.5),
                      E.AdagradMomentum(0.1, momentum=0.8, use_nesterov=True, beta2=0.9),
                      E.Adam(0.01, beta_1=0.8, lazy_adam=False, sum_inside_sqrt=False),
                      E.FTRL(0.1, learning_rate_power=-0.6, l1_regularization_strength=0.01,
                             beta=0.2),
                      sce.RowWiseAdagrad(0.05, initial_accumulator_value=0.0, epsilon=1e-6,
                                         clip_weight_max=3.0)):
        again = keras_config.deserialize_optimizer(keras_config.serialize_optimizer(optimizer))
        assert type(again) is type(optimizer)
        assert vars(again) == vars(optimizer)
    config = E.SparseCoreEmbeddingConfig(max_ids_per_table={"t": 8}, allow_id_dropping=True)
    again = keras_config.deserialize_sparse_core_config(
        keras_config.serialize_sparse_core_config(config))
    assert vars(again) == vars(config)


def test_feature_config_round_trip_keeps_shared_tables_and_nesting():
    table = E.TableConfig(vocabulary_size=10, dim=3, name="shared",
                          quantization_config=E.QuantizationConfig(16, -1.0, 1.0))
    config = {"x": [E.FeatureConfig(table=table, name="f1"),
                    E.FeatureConfig(table=table, name="f2", output_shape=[4, 2])],
              "y": (E.FeatureConfig(table=table, name="f3", max_sequence_length=0),)}
    again = keras_config.deserialize_feature_config(keras_config.serialize_feature_config(config))
    tf.nest.assert_same_structure(config, again)
    flat = tf.nest.flatten(again)
    assert all(f.table is flat[0].table for f in flat)
    assert flat[1].output_shape.as_list() == [4, 2]
    assert isinstance(flat[0].table.initializer, type(table.initializer))
    assert flat[0].table.initializer.get_config() == table.initializer.get_config()
    assert vars(flat[0].table.quantization_config) == vars(table.quantization_config)


def test_unserializable_learning_rate_fails_clearly():
    config = feature_config()
    with pytest.raises(ValueError, match="learning_rate.*callable"):
        keras_config.serialize_optimizer(E.SGD(learning_rate=lambda: 0.1))
    layer = EmbeddingLayer(config, optimizer=E.SGD(learning_rate=lambda: 0.1))
    with pytest.raises(ValueError, match="callable"):
        layer.get_config()


def test_initializer_outside_tensorflow_is_refused_before_its_module_is_imported():
    # A module that does not exist: importing it first would raise ModuleNotFoundError.
    with pytest.raises(ValueError, match="refusing to load initializer class"):
        keras_config.deserialize_initializer(
            {"tf_class": "tests_sce_no_such_module:Init", "config": {}})


def _weights_model(vocab_a=16, vocab_b=8):
    config = feature_config()
    config["a"] = E.FeatureConfig(table=E.TableConfig(
        vocabulary_size=vocab_a, dim=4, name="t_a",
        initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=1)), name="a")
    config["b"] = E.FeatureConfig(table=E.TableConfig(
        vocabulary_size=vocab_b, dim=2, name="t_b", initializer=tf.constant_initializer(0.25)),
        name="b")
    layer = EmbeddingLayer(config, optimizer=E.Adagrad(0.2), batch_size=B, name="emb")
    inputs = {n: keras.Input(shape=(None,), dtype="int32", ragged=True, name=n) for n in VOCAB}
    acts = layer(inputs)
    x = keras.layers.Concatenate()([acts[n] for n in VOCAB])
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer="sgd", loss="mse")
    return model, layer


@pytest.mark.parametrize("wrong", ["t_a", "t_b"])
def test_weights_file_with_a_wrong_table_shape_fails_and_writes_no_table(tmp_path, wrong):
    """Every table's shape is checked before any table is written (the arrays are read one at a
    time), whichever table is wrong."""
    model, layer = _weights_model()
    model.fit(data(2, "ragged"), epochs=1, verbose=0)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    other, other_layer = (_weights_model(vocab_a=17) if wrong == "t_a" else
                          _weights_model(vocab_b=9))
    before = other_layer.embedding.logical_tables(include_slots=True)
    shapes = {"t_a": r"\[16, 4\], the TableConfig \[17, 4\]",
              "t_b": r"\[8, 2\], the TableConfig \[9, 2\]"}
    with pytest.raises(ValueError, match=rf"table '{wrong}': the weights file's parameters has "
                                         rf"shape {shapes[wrong]}"):
        other.load_weights(path)
    after = other_layer.embedding.logical_tables(include_slots=True)
    for name, kinds in before.items():
        for kind, value in kinds.items():
            np.testing.assert_array_equal(after[name][kind], value, err_msg=f"{name}/{kind}")
    # The same file loads into a matching model, table by table, with every slot.
    again, again_layer = _weights_model()
    again.load_weights(path)
    for name, kinds in layer.embedding.logical_tables(include_slots=True).items():
        for kind, value in kinds.items():
            np.testing.assert_array_equal(
                again_layer.embedding.logical_tables(include_slots=True)[name][kind], value)


def test_placement_and_exchange_options_survive_the_layer_config():
    config = feature_config()
    layer = EmbeddingLayer(config, optimizer=E.SGD(0.1), exchange="all_to_all",
                           replication_threshold_bytes=0,
                           table_placement={config["a"].table: "replicated"},
                           collective_timeout_seconds=30.0)
    saved = layer.get_config()
    assert saved["table_placement"] == {"t_a": "replicated"}
    again = EmbeddingLayer.from_config(saved)
    restored = again.get_config()
    for key in ("exchange", "replication_threshold_bytes", "table_placement",
                "collective_timeout_seconds"):
        assert restored[key] == saved[key], key
