"""The Keras adaptation is isolated in keras_compat: installed on import for the tested Keras
range, a no-op for models without an EmbeddingLayer, and a warning (not silence) when Keras
changed."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras

from tests.keras.keras_test_utils import mirrored_strategy
from tf_sc_embedding import keras_compat
from tf_sc_embedding.keras import layer as keras_layer  # noqa: F401  (installs it)


def test_installed_for_the_installed_keras():
    assert keras_compat.keras_version_tested(), keras.__version__
    assert keras_compat.installed()


def test_tested_range_matches_requirements():
    import os  # pylint: disable=import-outside-toplevel
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "requirements.txt")) as f:
        line = next(l.strip() for l in f if l.startswith("keras"))
    low, high = keras_compat.TESTED_KERAS
    assert line == f"keras>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    assert keras_compat.keras_version_tested("3.15.1")
    assert not keras_compat.keras_version_tested("3.16.0")
    assert not keras_compat.keras_version_tested("2.15.0")


def test_models_without_embedding_layer_use_keras_unchanged(monkeypatch):
    trainer = keras_compat.trainer_class()
    original = trainer._maybe_symbolic_build.__wrapped__
    calls = []

    def spy(self, iterator=None, data_batch=None):
        calls.append(self)
        return original(self, iterator=iterator, data_batch=data_batch)
    monkeypatch.setattr(trainer._maybe_symbolic_build, "__wrapped__", spy)
    replacement = keras_compat._make_replacement(spy)  # pylint: disable=protected-access
    monkeypatch.setattr(trainer, "_maybe_symbolic_build", replacement)
    strategy = mirrored_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.ones((8, 3), np.float32)
    model.fit(x, np.ones((8, 1), np.float32), batch_size=4, verbose=0)
    assert calls and calls[0] is model


def test_warns_when_keras_changed(monkeypatch):
    trainer = keras_compat.trainer_class()
    current = trainer.__dict__["_maybe_symbolic_build"]
    try:
        keras_compat.uninstall()

        def changed(self, iterator=None, data_batch=None, extra=None):   # a new signature
            return None
        trainer._maybe_symbolic_build = changed
        with pytest.warns(RuntimeWarning, match="could not adapt Keras"):
            assert not keras_compat.install()
        assert not keras_compat.installed()
        del trainer._maybe_symbolic_build
        with pytest.warns(RuntimeWarning, match="has no TensorFlowTrainer._maybe_symbolic_build"):
            assert not keras_compat.install()
    finally:
        trainer._maybe_symbolic_build = current
        keras_compat._state.update(installed=True, reason="")  # pylint: disable=protected-access
    assert keras_compat.installed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keras_compat.install()     # idempotent, silent


def test_multi_worker_rejection_is_kept():
    class FakeModel:
        _distribute_strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)

        def _flatten_layers(self):
            return [object.__new__(keras_layer.EmbeddingLayer)]
    with pytest.raises(NotImplementedError, match="MultiWorkerMirroredStrategy"):
        keras_compat.reject_multi_worker_fit(FakeModel())


def test_in_symbolic_scope_follows_keras():
    assert not keras_compat.in_symbolic_scope()
    with keras.SymbolicScope():
        assert keras_compat.in_symbolic_scope()
    assert not keras_compat.in_symbolic_scope()
    seen = []

    class Probe(keras.layers.Layer):
        def call(self, x):
            seen.append(keras_compat.in_symbolic_scope())
            return x
    inputs = keras.Input((2,))
    keras.Model(inputs, Probe()(inputs))        # traced on a KerasTensor
    Probe()(np.ones((1, 2), np.float32))        # called on a value
    assert seen == [True, False]
