"""`EmbeddingLayer.preprocess` in `tf.data` (the recipe the main job uses): `fit` on preprocessed
batches trains exactly as `fit` on the raw ids, with one replica and with a MirroredStrategy fed
by `distribute_datasets_from_function`."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.keras.keras_test_utils import E, VOCAB, feature_config, mirrored_strategy
from tf_sc_embedding.keras.layer import EmbeddingLayer, PreprocessedFeatures

BATCH = 16
STEPS = 4


def _batches(seed=0):
    """STEPS global batches: ragged ids per feature, per-id weights and float labels."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        ids, weights = {}, {}
        for name, vocab in VOCAB.items():
            lengths = rng.integers(0, 4, BATCH)
            values = rng.integers(0, vocab, lengths.sum()).astype(np.int32)
            ids[name] = tf.RaggedTensor.from_row_lengths(values, lengths)
            weights[name] = tf.RaggedTensor.from_row_lengths(
                rng.uniform(0.5, 2.0, lengths.sum()).astype(np.float32), lengths)
        labels = rng.uniform(0, 1, (BATCH, 1)).astype(np.float32)
        dense = rng.uniform(-1, 1, (BATCH, 1)).astype(np.float32)
        out.append((ids, weights, dense, labels))
    return out


class TwoTableModel(keras.Model):
    def __init__(self, sparse):
        super().__init__()
        self.sparse = sparse
        self.head = keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, inputs, training=None):
        if isinstance(inputs["ids"], PreprocessedFeatures):
            activations = self.sparse(inputs["ids"], training=training)
        else:
            activations = self.sparse(inputs["ids"], inputs["weights"], training=training)
        return self.head(tf.concat([inputs["dense"]] + [activations[n] for n in sorted(VOCAB)],
                                   axis=1))


def _train(strategy, preprocessed):
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        layer = EmbeddingLayer(feature_config(), optimizer=E.Adagrad(learning_rate=0.3),
                               batch_size=BATCH)
        model = TwoTableModel(layer)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    batches = _batches()
    per_replica = BATCH // replicas

    def dataset_fn(input_context=None):
        # One input pipeline per worker; it hands its elements to the local replicas in turn, so
        # the elements are step-major, then replica r's samples [r*b, (r+1)*b) of that step.
        elements = []
        for ids, weights, dense, labels in batches:
            for r in range(replicas):
                part = slice(r * per_replica, (r + 1) * per_replica)
                # "dense" sorts first: Keras weights its running loss by the leading dimension
                # of the first input leaf, which must be batch-major (a preprocessed batch's is
                # not).
                elements.append(({"dense": dense[part],
                                  "ids": {n: v[part] for n, v in ids.items()},
                                  "weights": {n: v[part] for n, v in weights.items()}},
                                 labels[part]))
        spec = tf.nest.map_structure(tf.type_spec_from_value, elements[0])
        dataset = tf.data.Dataset.from_generator(lambda: iter(elements), output_signature=spec)
        if preprocessed:
            dataset = dataset.map(lambda x, y: (
                {"dense": x["dense"], "ids": layer.preprocess(x["ids"], x["weights"])}, y))
        return dataset.prefetch(2)

    if replicas == 1:
        data = dataset_fn()
    else:
        # Every input pipeline must read its own replica's samples: one pipeline per replica.
        data = strategy.distribute_datasets_from_function(dataset_fn)
    history = model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0, shuffle=False)
    return layer.embedding.logical_tables(include_slots=True), history.history["loss"]


@pytest.mark.parametrize("replicas", [1, 2])
def test_fit_on_preprocessed_batches_equals_fit_on_ids(replicas):
    def strategy():
        return tf.distribute.get_strategy() if replicas == 1 else mirrored_strategy(replicas)

    expected, expected_loss = _train(strategy(), preprocessed=False)
    got, loss = _train(strategy(), preprocessed=True)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    for name in expected:
        for kind in expected[name]:
            np.testing.assert_array_equal(got[name][kind], expected[name][kind],
                                          err_msg=f"{name}/{kind}")
    # Training moved the tables (the comparison is not between two untouched copies).
    untouched = feature_config()
    assert not np.allclose(got["t_a"]["parameters"],
                           untouched["a"].table.initializer(shape=(VOCAB["a"], 4)))


def test_preprocess_rejects_a_partial_batch():
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1), batch_size=BATCH)
    ids = {n: tf.ragged.constant([[0], [1]], dtype=tf.int32) for n in VOCAB}
    with pytest.raises(ValueError, match="full per-replica batches of 16"):
        layer.preprocess(ids)


def test_preprocess_needs_a_batch_size():
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1))
    ids = {n: tf.ragged.constant([[0]] * BATCH, dtype=tf.int32) for n in VOCAB}
    with pytest.raises(ValueError, match="batch_size"):
        layer.preprocess(ids)


def test_pipelined_fit_then_evaluate_sees_every_update():
    """With pipelining, fit keeps the last step's update; evaluate applies it before looking up,
    so it scores the same tables the saved weights hold, and those equal an explicit flush."""
    with tf.distribute.get_strategy().scope():
        layer = EmbeddingLayer(feature_config(), optimizer=E.Adagrad(learning_rate=0.3),
                               batch_size=BATCH, pipeline_execution_with_tensor_core=True)
        model = TwoTableModel(layer)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    elements = [({"dense": d, "ids": i, "weights": w}, y) for i, w, d, y in _batches()]
    spec = tf.nest.map_structure(tf.type_spec_from_value, elements[0])
    data = tf.data.Dataset.from_generator(lambda: iter(elements), output_signature=spec)
    model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0)
    first = model.evaluate(data.take(1), verbose=0)
    # Had evaluate not applied the kept update, this read would, and the second evaluate would
    # score other tables.
    tables = layer.embedding.logical_tables()
    second = model.evaluate(data.take(1), verbose=0)
    assert first == pytest.approx(second, rel=1e-7)
    assert layer.get_config()["pipeline_execution_with_tensor_core"] is True
    again = layer.embedding.logical_tables()
    for name in tables:
        np.testing.assert_array_equal(again[name], tables[name])
