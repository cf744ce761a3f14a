"""What this library needs from Keras beyond its public API, isolated here.

This is the only module of the library (and of its tests, benchmarks and examples) that imports
`keras.src`; `tests/test_private_apis.py` enforces it. Public Keras (`keras.Layer`,
`keras.KerasTensor`, `keras.tree`, `keras.saving`, ...) is used directly elsewhere.

What is private here, and why no public API serves:

* `keras.src.backend.tensorflow.trainer.TensorFlowTrainer._maybe_symbolic_build` (replaced, see
  below) and, inside the replacement, the model's `_distribute_strategy`, `_symbolic_build` and
  `_flatten_layers`. Keras has no hook for how a model is built under a strategy.
  `trainer_class()` gives the class (tests patch it too).
* `keras.src.backend.common.symbolic_scope.in_symbolic_scope` (`in_symbolic_scope()`): whether
  Keras is tracing a layer symbolically (building a functional model, or `compute_output_spec`),
  when `EmbeddingLayer.call` must return placeholders of the right shapes instead of looking ids up
  and updating tables. Keras exports the scope (`keras.SymbolicScope`) but no way to ask whether
  one is active.

The replacement of `_maybe_symbolic_build`. Keras 3 (TensorFlow backend) builds a model under a
`tf.distribute` strategy from the first batch of `fit` / `evaluate` / `predict` by averaging that
batch over the replicas (`strategy.reduce("MEAN", batch)`), which fails for ragged and sparse id
tensors ("'RaggedTensor' object has no attribute 'device'"). Only the shapes and dtypes of that
batch are used, so for a model holding an `EmbeddingLayer` the replacement builds from the first
replica's values when the batch holds ragged or sparse per-replica values. It also rejects `fit` /
`evaluate` / `predict` of such a model under MultiWorkerMirroredStrategy with a clear error
(Keras 3 fails there further in). Models without an `EmbeddingLayer` run Keras's own method
unchanged.

It is installed when `tf_sc_embedding.keras.layer` is imported, for the Keras versions in
`TESTED_KERAS` (the range in requirements.txt). With another version it is still installed if the
method exists with the expected signature, with a warning; if it cannot be installed, a warning
says what does not work (ragged / sparse inputs to `fit` under MirroredStrategy, and the
multi-worker rejection). `installed()` tells whether it is in place.
"""
# pylint: disable=import-outside-toplevel,protected-access
import inspect
import warnings

import tensorflow as tf

TESTED_KERAS = ((3, 15), (3, 16))        # [low, high): keep in sync with requirements.txt
_MARK = "_tf_sc_embedding_fix"

MULTI_WORKER_FIT_MESSAGE = (
    "model.fit / evaluate / predict of a model with an EmbeddingLayer is not supported under "
    "MultiWorkerMirroredStrategy (Keras 3 itself fails there). Use a custom training loop: "
    "strategy.run around the model call under a tf.GradientTape, then "
    "optimizer.apply_gradients; the layer updates its tables through the same gradient (see "
    "docs/multi_worker.md#launching)")

_state = {"installed": False, "reason": "not attempted"}


def _version(text):
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def keras_version_tested(version=None):
    """Whether a Keras version (default: the installed one) is in the tested range."""
    if version is None:
        import keras
        version = keras.__version__
    low, high = TESTED_KERAS
    return low <= _version(version) < high


def trainer_class():
    """Keras's `TensorFlowTrainer`, the base of `keras.Model` under the TensorFlow backend
    (raises ImportError if this Keras has none)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer
    return tf_trainer.TensorFlowTrainer


def in_symbolic_scope():
    """Whether Keras is tracing layers symbolically (building a functional model, or computing
    an output spec): `keras.SymbolicScope` is active. False if this Keras cannot tell."""
    try:
        from keras.src.backend.common import symbolic_scope
    except ImportError:
        return False
    return symbolic_scope.in_symbolic_scope()


def _has_embedding_layer(model):
    try:
        layers = model._flatten_layers()
    except AttributeError:
        layers = getattr(model, "layers", [])
    return any(getattr(layer, "_sce_embedding_layer", False) for layer in layers)


def reject_multi_worker_fit(model):
    strategy = getattr(model, "_distribute_strategy", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    if _has_embedding_layer(model):
        raise NotImplementedError(MULTI_WORKER_FIT_MESSAGE)


def _make_replacement(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if not _has_embedding_layer(self):
            return original(self, iterator=iterator, data_batch=data_batch)
        reject_multi_worker_fit(self)
        if self._distribute_strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        strategy = self.distribute_strategy
        batch = None
        for _, _, it in iterator:       # as Keras does: the first batch of the iterator
            batch = next(it)
            break
        if batch is not None:
            # Keras takes the element-wise MEAN over replicas, which only serves the shapes and
            # fails for ragged / sparse ids and for preprocessed batches (their sizes differ per
            # replica); the first local replica's value has the same per-replica shapes.
            batch = tf.nest.map_structure(
                lambda v: (strategy.experimental_local_results(v)[0]
                           if isinstance(v, tf.distribute.DistributedValues) else v), batch)
        with strategy.scope():
            self._symbolic_build(data_batch=batch)
        return None

    setattr(_maybe_symbolic_build, _MARK, True)
    _maybe_symbolic_build.__wrapped__ = original
    return _maybe_symbolic_build


def _not_installed(reason):
    _state.update(installed=False, reason=reason)
    warnings.warn(
        f"tf_sc_embedding could not adapt Keras ({reason}): model.fit / evaluate / predict of "
        "a model with an EmbeddingLayer under MirroredStrategy fails for ragged or sparse "
        "inputs, and is not rejected early under MultiWorkerMirroredStrategy. Use Keras "
        f"{TESTED_KERAS[0][0]}.{TESTED_KERAS[0][1]} to <{TESTED_KERAS[1][0]}.{TESTED_KERAS[1][1]}, "
        "or a custom training loop", RuntimeWarning, stacklevel=3)


def install():
    """Installs the replacement (idempotent); returns installed()."""
    if _state["installed"]:
        return True
    try:
        import keras
        cls = trainer_class()
    except ImportError as e:
        _not_installed(f"the TensorFlow trainer of Keras cannot be imported: {e}")
        return False
    original = cls.__dict__.get("_maybe_symbolic_build")
    if original is None:
        _not_installed(f"Keras {keras.__version__} has no TensorFlowTrainer._maybe_symbolic_build")
        return False
    if getattr(original, _MARK, False):
        _state.update(installed=True, reason="")
        return True
    params = list(inspect.signature(original).parameters)
    if params != ["self", "iterator", "data_batch"]:
        _not_installed(f"Keras {keras.__version__} changed TensorFlowTrainer._maybe_symbolic_build "
                       f"to take {params}")
        return False
    if not keras_version_tested(keras.__version__):
        warnings.warn(f"tf_sc_embedding is tested with Keras {TESTED_KERAS[0]} to "
                      f"<{TESTED_KERAS[1]}, not {keras.__version__}: its adaptation of Keras's "
                      "model building under a strategy is installed but untested",
                      RuntimeWarning, stacklevel=2)
    cls._maybe_symbolic_build = _make_replacement(original)
    _state.update(installed=True, reason="")
    return True


def installed():
    """Whether the replacement of TensorFlowTrainer._maybe_symbolic_build is in place."""
    try:
        cls = trainer_class()
    except ImportError:
        return False
    return getattr(cls.__dict__.get("_maybe_symbolic_build"), _MARK, False)


def uninstall():
    """Puts Keras's own method back (for tests)."""
    cls = trainer_class()
    current = cls.__dict__.get("_maybe_symbolic_build")
    if getattr(current, _MARK, False):
        cls._maybe_symbolic_build = current.__wrapped__
    _state.update(installed=False, reason="uninstalled")
