"""The Keras EmbeddingLayer: fit/evaluate/predict, per-table optimizers, inputs, replicas, CTLs,
checkpoints. Expected table updates come from a numpy reference of the tiny model
pred = sum of all activation entries (a Dense(1) kernel of ones), loss = mean squared error."""
import numpy as np
import pytest
import tensorflow as tf

import keras

from tests.keras.keras_test_utils import DIM, VOCAB, feature_config, initial, mirrored_strategy
from tf_sc_embedding.keras.layer import EmbeddingLayer

E = tf.tpu.experimental.embedding
B = 8
SGD_LR = 0.5


def sample_ids(num, seed=0, max_len=3):
    rng = np.random.default_rng(seed)
    return {n: [list(rng.integers(0, VOCAB[n], rng.integers(1, max_len + 1))) for _ in range(num)]
            for n in VOCAB}


def as_kind(lists, kind):
    if kind == "ragged":
        return tf.ragged.constant(lists, dtype=tf.int32)
    if kind == "sparse":
        return tf.ragged.constant(lists, dtype=tf.int64).to_sparse()
    return tf.constant([l[0] for l in lists], tf.int32)   # dense: one id per sample


def dataset(ids, labels, kind, batch):
    features = {n: as_kind(ids[n], kind) for n in ids}
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    return ds.batch(batch, drop_remainder=True)


def reference_sgd_step(tables, ids, labels, kind, lr=SGD_LR):
    """Tables after one SGD step on a batch (pred = sum of activations, MSE)."""
    if kind == "dense":
        ids = {n: [l[:1] for l in ids[n]] for n in ids}
    pred = np.zeros(len(labels))
    for n in ids:
        for s, row in enumerate(ids[n]):
            pred[s] += sum(tables[n][i].sum() for i in row)
    grad = 2 * (pred - labels[:, 0]) / len(labels)
    new = {n: tables[n].copy() for n in tables}
    for n in ids:
        for s, row in enumerate(ids[n]):
            for i in row:
                new[n][i] -= lr * grad[s]
    return new, pred


def reference_predictions(tables, ids, kind):
    if kind == "dense":
        ids = {n: [l[:1] for l in ids[n]] for n in ids}
    num = len(next(iter(ids.values())))
    return np.array([sum(tables[n][i].sum() for n in ids for i in ids[n][s])
                     for s in range(num)])


def keras_input(name, kind):
    if kind == "ragged":
        return keras.Input(shape=(None,), dtype="int32", ragged=True, name=name)
    if kind == "sparse":
        return keras.Input(shape=(None,), dtype="int64", sparse=True, name=name)
    return keras.Input(shape=(), dtype="int32", name=name)


def functional_model(kind, table_optimizer=None, batch_size=B, model_optimizer="adagrad",
                     combiner="sum"):
    layer = EmbeddingLayer(feature_config(combiner), optimizer=table_optimizer or E.SGD(SGD_LR),
                           batch_size=batch_size, name="emb")
    inputs = {n: keras_input(n, kind) for n in VOCAB}
    activations = layer(inputs)
    merged = keras.layers.Concatenate()([activations[n] for n in VOCAB])
    output = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)(merged)
    model = keras.Model(inputs, output)
    model.compile(optimizer=make_optimizer(model_optimizer), loss="mse")
    return model, layer


def make_optimizer(name):
    return {"adagrad": lambda: keras.optimizers.Adagrad(0.1),
            "adam": lambda: keras.optimizers.Adam(0.01),
            "sgd": lambda: keras.optimizers.SGD(0.01)}[name]()


class Subclassed(keras.Model):
    def __init__(self, batch_size=B, table_optimizer=None):
        super().__init__()
        self.emb = EmbeddingLayer(feature_config(), optimizer=table_optimizer or E.SGD(SGD_LR),
                                  batch_size=batch_size)
        self.head = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)

    def call(self, inputs, training=None):
        activations = self.emb(inputs, training=training)
        return self.head(tf.concat([activations[n] for n in VOCAB], axis=1))


def tables_of(layer):
    return {n: layer.embedding.logical_tables()[f"t_{n}"] for n in VOCAB}


def labels_for(num, seed=1):
    return np.random.default_rng(seed).normal(0, 1, (num, 1)).astype(np.float32)


@pytest.mark.parametrize("model_optimizer", ["adagrad", "adam", "sgd"])
def test_fit_updates_tables_with_their_own_optimizer(model_optimizer):
    """SGD tables under an Adagrad/Adam/SGD model optimizer: exactly one SGD step per batch."""
    ids, labels = sample_ids(B), labels_for(B)
    model, layer = functional_model("ragged", model_optimizer=model_optimizer)
    before = tables_of(layer)
    model.fit(dataset(ids, labels, "ragged", B), epochs=1, verbose=0)
    expected, _ = reference_sgd_step(before, ids, labels, "ragged")
    after = tables_of(layer)
    for n in VOCAB:
        np.testing.assert_allclose(after[n], expected[n], rtol=1e-5, atol=1e-6)
        assert np.abs(after[n] - before[n]).max() > 1e-3
    # The model optimizer knows the trigger (a scalar, kept at 0) and the Dense kernel only: no
    # variable of it has a table's shape, and the tables are not Keras weights.
    assert float(layer.trigger.numpy()) == 0.0
    table_shapes = {(VOCAB[n], DIM[n]) for n in VOCAB}
    assert all(tuple(v.shape) not in table_shapes for v in model.optimizer.variables)
    assert all(tuple(v.shape) in {(), (6, 1)} for v in model.trainable_variables)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_fit_dense_and_sparse_inputs(kind):
    ids, labels = sample_ids(B, seed=3), labels_for(B, seed=4)
    model, layer = functional_model(kind)
    before = tables_of(layer)
    model.fit(dataset(ids, labels, kind, B), epochs=1, verbose=0)
    expected, _ = reference_sgd_step(before, ids, labels, kind)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer)[n], expected[n], rtol=1e-5, atol=1e-6)


def test_subclassed_model_fit_predict_evaluate():
    ids, labels = sample_ids(2 * B, seed=5), labels_for(2 * B, seed=6)
    model = Subclassed()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ds = dataset(ids, labels, "ragged", B)
    before = tables_of(model.emb)
    first = {n: ids[n][:B] for n in ids}
    expected, _ = reference_sgd_step(before, first, labels[:B], "ragged")
    model.fit(ds.take(1), verbose=0)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(model.emb)[n], expected[n], rtol=1e-5, atol=1e-6)
    trained = tables_of(model.emb)
    predictions = model.predict(ds, verbose=0)
    model.evaluate(ds, verbose=0)
    for n in VOCAB:   # predict and evaluate never update the tables
        np.testing.assert_array_equal(tables_of(model.emb)[n], trained[n])
    kernel = model.head.kernel.numpy()[:, 0]
    assert np.allclose(kernel, kernel[0])   # still uniform: predictions = kernel * sum
    np.testing.assert_allclose(predictions[:, 0],
                               kernel[0] * reference_predictions(trained, ids, "ragged"),
                               rtol=1e-5, atol=1e-5)


def test_predict_pads_a_partial_last_batch_and_tables_built_lazily():
    ids = sample_ids(B + 3, seed=7)
    model, layer = functional_model("ragged", batch_size=None)
    features = {n: as_kind(ids[n], "ragged") for n in ids}
    ds = tf.data.Dataset.from_tensor_slices(features).batch(B)   # last batch has 3 samples
    assert not layer.embedding.built
    predictions = model.predict(ds, verbose=0)
    assert layer.embedding.built     # from the first batch's static size
    np.testing.assert_allclose(predictions[:, 0],
                               reference_predictions(tables_of(layer), ids, "ragged"), rtol=1e-5)


def test_frozen_tables_do_not_train():
    ids, labels = sample_ids(B, seed=8), labels_for(B, seed=9)
    model, layer = functional_model("ragged")
    layer.trainable = False
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    before = tables_of(layer)
    model.fit(dataset(ids, labels, "ragged", B), verbose=0)
    assert all(v is not layer.trigger for v in model.trainable_variables)
    for n in VOCAB:
        np.testing.assert_array_equal(tables_of(layer)[n], before[n])


def test_mirrored_strategy_matches_reference_and_one_replica():
    ids, labels = sample_ids(4 * B, seed=10), labels_for(4 * B, seed=11)
    strategy = mirrored_strategy(2)
    with strategy.scope():
        model2, layer2 = functional_model("ragged", table_optimizer=E.SGD(SGD_LR),
                                          batch_size=2 * B)
    model1, layer1 = functional_model("ragged", batch_size=2 * B)
    ds = dataset(ids, labels, "ragged", 2 * B)
    before = tables_of(layer1)
    first = {n: ids[n][:2 * B] for n in ids}
    expected, _ = reference_sgd_step(before, first, labels[:2 * B], "ragged")
    model2.fit(ds.take(1), verbose=0)
    for n in VOCAB:   # replicas' gradients add up to the global batch's mean-loss gradient
        np.testing.assert_allclose(tables_of(layer2)[n], expected[n], rtol=1e-5, atol=1e-6)
    model1.fit(ds.take(1), verbose=0)
    model1.fit(ds, epochs=2, verbose=0)
    model2.fit(ds, epochs=2, verbose=0)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer2)[n], tables_of(layer1)[n], rtol=1e-4,
                                   atol=1e-5)
    np.testing.assert_allclose(model2.predict(ds, verbose=0), model1.predict(ds, verbose=0),
                               rtol=1e-4, atol=1e-5)


def test_custom_training_loops():
    """A tape over model.trainable_variables updates the tables as fit does; explicit
    enqueue/dequeue/apply_gradients on the layer's embedding still works (2 replicas)."""
    ids, labels = sample_ids(B, seed=12), labels_for(B, seed=13)
    model, layer = functional_model("ragged")
    optimizer = keras.optimizers.Adam(0.01)
    features = {n: as_kind(ids[n], "ragged") for n in ids}
    before = tables_of(layer)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step(features, labels)
    expected, _ = reference_sgd_step(before, ids, labels, "ragged")
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer)[n], expected[n], rtol=1e-5, atol=1e-6)

    strategy = mirrored_strategy(2)
    with strategy.scope():
        layer2 = EmbeddingLayer(feature_config(), optimizer=E.SGD(SGD_LR), batch_size=B)
    embedding = layer2.embedding
    before = tables_of(layer2)
    ds = strategy.experimental_distribute_dataset(dataset(ids, labels, "ragged", B))

    @tf.function
    def ctl_step(x, y):
        def replica_step(x, y):
            preprocessed = embedding.enqueue(x)
            activations, preserved = embedding.dequeue(preprocessed)
            with tf.GradientTape() as tape:
                tape.watch(activations)
                pred = tf.add_n([tf.reduce_sum(activations[n], 1) for n in VOCAB])[:, None]
                loss = tf.reduce_sum(tf.square(pred - y)) / B
            embedding.apply_gradients(tape.gradient(loss, activations), preserved)
            return loss
        return strategy.run(replica_step, args=(x, y))

    for x, y in ds:
        ctl_step(x, y)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer2)[n], expected[n], rtol=1e-5, atol=1e-6)


def test_tf_train_checkpoint_restores_into_another_topology(tmp_path):
    ids, labels = sample_ids(2 * B, seed=14), labels_for(2 * B, seed=15)
    ds = dataset(ids, labels, "ragged", 2 * B)
    model1, layer1 = functional_model("ragged", table_optimizer=E.Adagrad(0.3),
                                      batch_size=2 * B)
    model1.fit(ds, epochs=2, verbose=0)
    path = tf.train.Checkpoint(model=model1).save(str(tmp_path / "ckpt"))
    strategy = mirrored_strategy(2)
    with strategy.scope():
        model2, layer2 = functional_model("ragged", table_optimizer=E.Adagrad(0.3),
                                          batch_size=2 * B)
    tf.train.Checkpoint(model=model2).restore(path)
    for n in VOCAB:
        np.testing.assert_array_equal(tables_of(layer2)[n], tables_of(layer1)[n])
        config = layer1.embedding.tables.config(f"t_{n}")
        config2 = layer2.embedding.tables.config(f"t_{n}")
        np.testing.assert_array_equal(layer2.embedding.logical_slot(config2, "accumulators"),
                                      layer1.embedding.logical_slot(config, "accumulators"))
    np.testing.assert_allclose(model2.predict(ds, verbose=0), model1.predict(ds, verbose=0),
                               rtol=1e-5)


def test_keras_checkpoint_callback_and_load_weights(tmp_path):
    ids, labels = sample_ids(2 * B, seed=16), labels_for(2 * B, seed=17)
    ds = dataset(ids, labels, "ragged", B)
    model1, layer1 = functional_model("ragged", table_optimizer=E.Adagrad(0.3),
                                      model_optimizer="sgd")
    path = str(tmp_path / "model.weights.h5")
    model1.fit(ds, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    # A new model whose tables are not built yet: restored when the first batch builds them.
    model2, layer2 = functional_model("ragged", table_optimizer=E.Adagrad(0.3), batch_size=None,
                                      model_optimizer="sgd")
    model2.load_weights(path)
    assert not layer2.embedding.built
    np.testing.assert_allclose(model2.predict(ds, verbose=0), model1.predict(ds, verbose=0),
                               rtol=1e-5)
    for n in VOCAB:
        np.testing.assert_array_equal(tables_of(layer2)[n], tables_of(layer1)[n])
        slots = [layer.embedding.logical_tables(include_slots=True)[f"t_{n}"]["accumulators"]
                 for layer in (layer1, layer2)]
        np.testing.assert_array_equal(slots[1], slots[0])
    # Training continues identically from the restored optimizer slots (the model optimizer is
    # stateless SGD: Keras weight files do not hold optimizer state).
    model1.fit(ds, verbose=0)
    model2.fit(ds, verbose=0)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer2)[n], tables_of(layer1)[n], rtol=1e-5,
                                   atol=1e-6)


def test_non_finite_loss_fails_fit_naming_the_feature_and_tables_stay():
    """A NaN label gives NaN activation gradients: fit stops naming the features, and no table
    changes (the default non_finite_gradients="error" of the layer's embedding)."""
    ids, labels = sample_ids(B, seed=5), labels_for(B, seed=6)
    labels[2, 0] = np.nan
    model, layer = functional_model("ragged")
    before = tables_of(layer)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"feature 'a' \(table 't_a'\), feature 'b' \(table 't_b'\)"):
        model.fit(dataset(ids, labels, "ragged", B), epochs=1, verbose=0)
    for n in VOCAB:
        np.testing.assert_array_equal(tables_of(layer)[n], before[n])


def test_layer_passes_and_saves_the_embedding_options():
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(SGD_LR), batch_size=B,
                           non_finite_gradients="skip", adapt_sparse_core_limits=True)
    config = layer.get_config()
    assert config["non_finite_gradients"] == "skip" and config["adapt_sparse_core_limits"]
    again = EmbeddingLayer.from_config(config)
    assert again.get_config()["non_finite_gradients"] == "skip"
    ids, labels = sample_ids(B, seed=7), labels_for(B, seed=8)
    labels[0, 0] = np.nan
    inputs = {n: keras_input(n, "ragged") for n in VOCAB}
    activations = layer(inputs)
    output = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False)(
        keras.layers.Concatenate()([activations[n] for n in VOCAB]))
    model = keras.Model(inputs, output)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(dataset(ids, labels, "ragged", B), epochs=1, verbose=0)
    touched = sum(len(set(ids[n][0])) for n in VOCAB)   # rows of sample 0, per table
    assert layer.embedding.counters().skipped_gradient_rows >= touched
    assert layer.embedding.sparse_core_limits is not None
