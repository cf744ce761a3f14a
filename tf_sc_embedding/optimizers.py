"""Binds TensorFlow's embedding optimizer configs to the fused optimizers of the op library.

The math, slot order and hyperparameter names of each optimizer are defined once, in C++
(cc/core/optimizers.h, described by `ops.OPTIMIZERS`). TensorFlow's config classes
(`tf.tpu.experimental.embedding.SGD`, `Adagrad`, `AdagradMomentum`, `Adam`, `FTRL`) already define
the slot initial values (`_slot_initializers()`) and user-facing hyperparameters; this module only
maps one onto the other and rejects settings the fused kernels cannot honour.
"""
import dataclasses
import math
from typing import Callable, Dict, Tuple

import tensorflow as tf
from absl import logging

from tf_sc_embedding.ops import OPTIMIZERS
from tf_sc_embedding.ops.fused_update import fused_update_function

_embedding = tf.tpu.experimental.embedding


@dataclasses.dataclass(frozen=True)
class _Binding:
    definition: str                                   # key into ops.OPTIMIZERS
    hyperparameters: Callable[[object], Dict[str, object]]
    validate: Callable[[object], None] = lambda optimizer: None


def _positive(name, value, what):
    if not value > 0:
        raise ValueError(f"{what}: {name} must be > 0, got {value}")


def _validate_adam(o):
    if not 0 <= o.beta_1 < 1 or not 0 <= o.beta_2 < 1:
        raise ValueError(f"Adam: beta_1 and beta_2 must be in [0, 1), got {o.beta_1}, {o.beta_2}")
    _positive("epsilon", o.epsilon, "Adam")
    if not o.lazy_adam:
        logging.warning("Adam(lazy_adam=False) is applied lazily: only rows a batch touches are "
                        "updated (the fused SparseCore update is always lazy).")


_BINDINGS = {
    _embedding.SGD: _Binding("sgd", lambda o: {}),
    _embedding.Adagrad: _Binding(
        "adagrad", lambda o: {},
        lambda o: _positive("initial_accumulator_value", o.initial_accumulator_value, "Adagrad")),
    _embedding.AdagradMomentum: _Binding(
        "adagrad_momentum",
        lambda o: dict(use_nesterov=bool(o.use_nesterov), exponent=float(o.exponent),
                       beta1=float(o.momentum), beta2=float(o.beta2), epsilon=float(o.epsilon)),
        lambda o: (_positive("epsilon", o.epsilon, "AdagradMomentum"),
                   _positive("exponent", o.exponent, "AdagradMomentum"))),
    _embedding.Adam: _Binding(
        "adam",
        lambda o: dict(use_sum_inside_sqrt=bool(o.sum_inside_sqrt), beta1=float(o.beta_1),
                       beta2=float(o.beta_2), epsilon=float(o.epsilon)),
        _validate_adam),
    _embedding.FTRL: _Binding(
        "ftrl",
        lambda o: dict(multiply_linear_by_learning_rate=bool(o.multiply_linear_by_learning_rate),
                       beta=float(o.beta), learning_rate_power=float(o.learning_rate_power),
                       l1_regularization_strength=float(o.l1_regularization_strength),
                       l2_regularization_strength=float(o.l2_regularization_strength)),
        lambda o: _positive("initial_accumulator_value", o.initial_accumulator_value, "FTRL")),
}


@dataclasses.dataclass(frozen=True)
class FusedOptimizer:
    """Everything the embedding needs to create slots for a table and update it."""
    config: object                 # the user's TensorFlow optimizer config
    definition_name: str
    slot_names: Tuple[str, ...]    # TensorFlow's slot names, e.g. ("accumulators",)
    slot_initializers: tuple
    hyperparameters: Dict[str, object]
    clip_weight_min: float
    clip_weight_max: float

    def learning_rate(self):
        """The learning rate as a float32 tensor (callables are re-evaluated every step)."""
        lr = self.config.learning_rate
        return tf.cast(lr() if callable(lr) else lr, tf.float32)

    def apply(self, **csr_and_variables):
        """Runs the fused update op with this optimizer's hyperparameters."""
        return fused_update_function(self.definition_name)(
            **csr_and_variables, learning_rate=self.learning_rate(),
            clip_weight_min=self.clip_weight_min, clip_weight_max=self.clip_weight_max,
            **self.hyperparameters)

    def stacking_key(self):
        """Tables stack only if their optimizers are interchangeable (docs/layout.md#stacking)."""
        lr = self.config.learning_rate
        lr_key = id(lr) if callable(lr) else float(lr)
        return (self.definition_name, lr_key, self.clip_weight_min, self.clip_weight_max,
                tuple(sorted(self.hyperparameters.items())),
                tuple(repr(i.get_config()) if hasattr(i, "get_config") else repr(i)
                      for i in self.slot_initializers))


def fused_optimizer(config, where):
    """Validates a TensorFlow optimizer config and binds it to a fused optimizer."""
    binding = _BINDINGS.get(type(config))
    if binding is None:
        supported = ", ".join(c.__name__ for c in _BINDINGS)
        raise ValueError(f"{where}: unsupported optimizer {type(config).__name__}; "
                         f"use one of tf.tpu.experimental.embedding.{{{supported}}}")
    if getattr(config, "weight_decay_factor", None) is not None:
        raise NotImplementedError(f"{where}: weight_decay_factor is not supported by the fused "
                                  "SparseCore optimizers (TensorFlow rejects it as well)")
    if getattr(config, "clip_gradient_min", None) is not None or \
            getattr(config, "clip_gradient_max", None) is not None:
        raise NotImplementedError(f"{where}: clipvalue (gradient clipping) is not supported by "
                                  "the fused SparseCore optimizers")
    binding.validate(config)
    definition = OPTIMIZERS[binding.definition]
    slot_names = tuple(config._slot_names())  # TensorFlow's own slot definitions
    if len(slot_names) != len(definition.slots):
        raise ValueError(f"{where}: {type(config).__name__} has slots {slot_names} but the fused "
                         f"kernel expects {definition.slots}")
    clip_min = -math.inf if config.clip_weight_min is None else float(config.clip_weight_min)
    clip_max = math.inf if config.clip_weight_max is None else float(config.clip_weight_max)
    return FusedOptimizer(config, binding.definition, slot_names,
                          tuple(config._slot_initializers()), binding.hyperparameters(config),
                          clip_min, clip_max)
