"""Dense [batch, n] ids (issue 9, point 6): TensorFlow's semantics (each id is a sample of its own,
activations [batch, n, dim], the combiner applied to that single id with its weight), through
`fit` with and without `batch_size=`, `predict` with a partial batch, MirroredStrategy and a custom
loop; the TPUEmbeddingV2 path gives the same activations as a dense reference."""
import numpy as np
import pytest
import tensorflow as tf

import keras

from tests.keras.keras_test_utils import DIM, VOCAB, feature_config, initial  # noqa: E402

from tests.keras.keras_test_utils import mirrored_strategy
from tf_sc_embedding.keras.layer import EmbeddingLayer
import tf_sc_embedding as sce

E = tf.tpu.experimental.embedding
B, N = 8, 2
LR = 0.5


def ids_and_labels(num, seed):
    rng = np.random.default_rng(seed)
    ids = {n: rng.integers(0, VOCAB[n], size=(num, N)).astype(np.int32) for n in VOCAB}
    return ids, rng.normal(size=(num, 1)).astype(np.float32)


def model_for(layer, batch=None):
    inputs = {n: keras.Input(shape=(N,), batch_size=batch, dtype="int32", name=n) for n in VOCAB}
    acts = layer(inputs)
    flat = keras.layers.Concatenate()([keras.layers.Flatten()(acts[n]) for n in VOCAB])
    out = keras.layers.Dense(1, kernel_initializer="ones", use_bias=False, trainable=False)(flat)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


def reference_step(tables, ids, labels):
    """One SGD step of pred = sum of all activations (each id its own sample), MSE."""
    pred = sum(tables[n][ids[n]].sum(axis=(1, 2)) for n in VOCAB)
    grad = 2 * (pred - labels[:, 0]) / len(labels)
    new = {n: tables[n].copy() for n in VOCAB}
    for n in VOCAB:
        for s in range(len(labels)):
            for i in ids[n][s]:
                new[n][i] -= LR * grad[s]
    return new, pred


def tables_of(layer):
    return {n: layer.embedding.logical_tables()[f"t_{n}"] for n in VOCAB}


@pytest.mark.parametrize("batch_size", [B, None])
def test_fit_dense_multi_id_single_replica(batch_size):
    ids, labels = ids_and_labels(B, seed=1)
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(LR), batch_size=batch_size)
    model = model_for(layer)
    before = {n: initial(n) for n in VOCAB}
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(B, drop_remainder=True)
    model.fit(ds, epochs=1, verbose=0)
    assert layer.embedding.per_replica_feature_shapes() == [(B, N), (B, N)]
    expected, _ = reference_step(before, ids, labels)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer)[n], expected[n], rtol=1e-5, atol=1e-6)
    # predict with a partial last batch: padded, then sliced back to [rows, n, dim]
    more, _ = ids_and_labels(B + 3, seed=2)
    out = model.predict(tf.data.Dataset.from_tensor_slices(more).batch(B), verbose=0)
    trained = tables_of(layer)
    want = sum(trained[n][more[n]].sum(axis=(1, 2)) for n in VOCAB)
    np.testing.assert_allclose(out[:, 0], want, rtol=1e-5, atol=1e-5)
    acts = layer({n: tf.constant(more[n][:B]) for n in VOCAB}, training=False)
    for n in VOCAB:
        assert acts[n].shape == (B, N, DIM[n])
        np.testing.assert_allclose(acts[n].numpy(), trained[n][more[n][:B]], rtol=1e-6)


def test_fit_dense_multi_id_two_replicas():
    strategy = mirrored_strategy(2)
    ids, labels = ids_and_labels(2 * B, seed=3)
    with strategy.scope():
        layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(LR), batch_size=2 * B)
        model = model_for(layer)
    before = {n: initial(n) for n in VOCAB}
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(2 * B, drop_remainder=True)
    model.fit(ds, epochs=1, verbose=0)
    expected, _ = reference_step(before, ids, labels)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer)[n], expected[n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
def test_combiner_applies_to_each_single_id_sample_with_weights(combiner):
    """As TensorFlow: a dense [batch, n] feature is batch*n one-id samples; the combiner scales
    each by its weight: sum -> w * row, mean -> row, sqrtn -> w / |w| * row."""
    config = feature_config(combiner)
    embedding = sce.TPUEmbeddingV2(config, optimizer=E.SGD(LR))
    ids, _ = ids_and_labels(B, seed=4)
    weights = {n: np.random.default_rng(5).uniform(0.5, 2.0, size=(B, N)).astype(np.float32)
               for n in VOCAB}
    acts, _ = embedding({n: tf.constant(v) for n, v in ids.items()},
                        {n: tf.constant(v) for n, v in weights.items()})
    for n in VOCAB:
        rows = initial(n)[ids[n]]
        w = weights[n][..., None]
        want = {"sum": w * rows, "mean": rows, "sqrtn": rows}[combiner]
        assert acts[n].shape == (B, N, DIM[n])
        np.testing.assert_allclose(acts[n].numpy(), want, rtol=1e-5, atol=1e-6)


def test_custom_loop_with_batch_size_and_dense_multi_ids():
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(LR), batch_size=B)
    assert layer.embedding.built    # for one id per sample; laid out again at the first call
    ids, labels = ids_and_labels(B, seed=6)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            acts = layer(ids, training=True)
            pred = tf.add_n([tf.reduce_sum(acts[n], axis=[1, 2]) for n in VOCAB])
            loss = tf.reduce_mean((pred - labels[:, 0]) ** 2)
        grads = tape.gradient(loss, layer.trainable_variables)
        return grads
    step({n: tf.constant(v) for n, v in ids.items()}, tf.constant(labels))
    expected, _ = reference_step({n: initial(n) for n in VOCAB}, ids, labels)
    for n in VOCAB:
        np.testing.assert_allclose(tables_of(layer)[n], expected[n], rtol=1e-5, atol=1e-6)
