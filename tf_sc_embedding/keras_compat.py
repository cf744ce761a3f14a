"""The one change this library makes to Keras, isolated here: model building under a strategy.

Why. Keras 3 (TensorFlow backend) builds a model under a `tf.distribute` strategy from the first
batch of `fit` / `evaluate` / `predict` by averaging that batch over the replicas
(`strategy.reduce("MEAN", batch)`), which fails for ragged and sparse id tensors ("'RaggedTensor'
object has no attribute 'device'"). Only the shapes and dtypes of that batch are used, so for a
model holding an `EmbeddingLayer` the replacement below builds from the first replica's values
when the batch holds ragged or sparse per-replica values. It also rejects `fit` / `evaluate` /
`predict` of such a model under MultiWorkerMirroredStrategy with a clear error (Keras 3 fails
there further in). Models without an `EmbeddingLayer` run Keras's own method unchanged.

There is no public hook for this: the replacement is installed on
`keras.src.backend.tensorflow.trainer.TensorFlowTrainer._maybe_symbolic_build` when
`tf_sc_embedding.keras_layer` is imported, for the Keras versions in `TESTED_KERAS` (the range in
requirements.txt). With another version it is still installed if the method exists with the
expected signature, with a warning; if it cannot be installed, a warning says what does not work
(ragged / sparse inputs to `fit` under MirroredStrategy, and the multi-worker rejection).
`installed()` tells whether it is in place.
"""
import inspect
import warnings

import tensorflow as tf

TESTED_KERAS = ((3, 15), (3, 16))        # [low, high): keep in sync with requirements.txt
_MARK = "_tf_sc_embedding_fix"

MULTI_WORKER_FIT_MESSAGE = (
    "model.fit / evaluate / predict of a model with an EmbeddingLayer is not supported under "
    "MultiWorkerMirroredStrategy (Keras 3 itself fails there). Use a custom training loop: "
    "strategy.run around the model call under a tf.GradientTape, then "
    "optimizer.apply_gradients; the layer updates its tables through the same gradient (see the "
    "README, 'Multi-worker training', and docs/multi_worker.md#launching)")

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
        import keras  # pylint: disable=import-outside-toplevel
        version = keras.__version__
    low, high = TESTED_KERAS
    return low <= _version(version) < high


def _has_embedding_layer(model):
    try:
        layers = model._flatten_layers()  # pylint: disable=protected-access
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
        if self._distribute_strategy is None or iterator is None:  # pylint: disable=protected-access
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
            self._symbolic_build(data_batch=batch)  # pylint: disable=protected-access
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
        import keras  # pylint: disable=import-outside-toplevel
        from keras.src.backend.tensorflow import trainer as tf_trainer  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        _not_installed(f"the TensorFlow trainer of Keras cannot be imported: {e}")
        return False
    cls = tf_trainer.TensorFlowTrainer
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
        from keras.src.backend.tensorflow import trainer as tf_trainer  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    return getattr(tf_trainer.TensorFlowTrainer.__dict__.get("_maybe_symbolic_build"), _MARK, False)


def uninstall():
    """Puts Keras's own method back (for tests)."""
    from keras.src.backend.tensorflow import trainer as tf_trainer  # pylint: disable=import-outside-toplevel
    current = tf_trainer.TensorFlowTrainer.__dict__.get("_maybe_symbolic_build")
    if getattr(current, _MARK, False):
        tf_trainer.TensorFlowTrainer._maybe_symbolic_build = current.__wrapped__
    _state.update(installed=False, reason="uninstalled")
