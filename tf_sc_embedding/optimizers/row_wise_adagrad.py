"""`RowWiseAdagrad`: an embedding optimizer config that TensorFlow does not have.

Adagrad keeps one accumulator per table element, so its slot is as large as the table. Row-wise
Adagrad (FBGEMM's exact row-wise Adagrad, TorchRec's default for embeddings) keeps one per row:
per row r with summed gradient g over its D embedding columns,

    acc[r] += mean_d(g[d]^2);    w[r, :] -= lr / (sqrt(acc[r]) + epsilon) * g

so the slot costs 4 bytes per row instead of 4 * D. The math lives in cc/core/optimizers.h
(`RowWiseAdagradOptimizer`); this class is the user-facing config, written to TensorFlow's config
protocol (`learning_rate`, `clip_weight_min` / `clip_weight_max`, `slot_variable_creation_fn`,
`_slot_names()`, `_slot_initializers()`), so that it goes wherever one of
`tf.tpu.experimental.embedding`'s optimizers goes: the embedding's default optimizer, a
`TableConfig`'s optimizer, `EmbeddingLayer`, and `.keras` configs. Its slot is named like
Adagrad's, `accumulators`, and checkpoints hold it as `[vocabulary_size, 1]`.

It derives from no TensorFlow class: TensorFlow's optimizer base class is private
(`tensorflow.python.tpu.tpu_embedding_v2_utils._Optimizer`) and its subclasses carry TPU
runtime hooks (`_set_optimization_parameters`, `_load`, `_retrieve`) that have no meaning here.
"""
import numbers

import tensorflow as tf


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"RowWiseAdagrad: {name} must be a number > 0, got {value!r}")


class RowWiseAdagrad:
    """Exact row-wise Adagrad: one accumulator per embedding row (see the module docstring).

    Args:
      learning_rate: a float > 0, or a callable returning the learning rate (evaluated every
        step, like TensorFlow's optimizers).
      initial_accumulator_value: the accumulator's initial value (>= 0; FBGEMM starts at 0).
      epsilon: added to sqrt(acc) in the denominator (> 0).
      clip_weight_min, clip_weight_max: clip the updated weights (None: no clipping).
      slot_variable_creation_fn: accepted for TensorFlow's signature; as with TensorFlow's
        optimizers in this library, the embedding creates the (sharded) slot variables itself.
    """

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-8,
                 clip_weight_min=None, clip_weight_max=None, slot_variable_creation_fn=None):
        self.learning_rate = learning_rate
        self.initial_accumulator_value = initial_accumulator_value
        self.epsilon = epsilon
        self.clip_weight_min = clip_weight_min
        self.clip_weight_max = clip_weight_max
        self.slot_variable_creation_fn = slot_variable_creation_fn
        # TensorFlow's config attributes that this optimizer does not offer (always off).
        self.weight_decay_factor = None
        self.clip_gradient_min = self.clip_gradient_max = None
        self.validate()

    def validate(self):
        """Raises ValueError for hyperparameters the update cannot use. Called here and again
        when an embedding binds the config (attributes may have changed since)."""
        if not callable(self.learning_rate):
            _check_positive("learning_rate", self.learning_rate)
        _check_positive("epsilon", self.epsilon)
        value = self.initial_accumulator_value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
            raise ValueError("RowWiseAdagrad: initial_accumulator_value must be a number >= 0, "
                             f"got {value!r}")
        low, high = self.clip_weight_min, self.clip_weight_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"RowWiseAdagrad: clip_weight_min ({low}) must not exceed "
                             f"clip_weight_max ({high})")

    def _slot_names(self):
        return ["accumulators"]

    def _slot_initializers(self):
        return [tf.constant_initializer(self.initial_accumulator_value, support_partition=True)]

    def __repr__(self):
        return (f"RowWiseAdagrad(learning_rate={self.learning_rate!r}, "
                f"initial_accumulator_value={self.initial_accumulator_value!r}, "
                f"epsilon={self.epsilon!r})")
