"""Binds TensorFlow's embedding optimizer configs to the fused optimizers of the op library.

The math, slot order, slot shapes and hyperparameter names of each optimizer are defined once, in
C++ (cc/core/optimizers.h, described by `ops.OPTIMIZERS`). TensorFlow's config classes
(`tf.tpu.experimental.embedding.SGD`, `Adagrad`, `AdagradMomentum`, `Adam`, `FTRL`) and this
library's `RowWiseAdagrad` (row_wise_adagrad.py, which TensorFlow lacks) define the slot initial
values (`_slot_initializers()`) and user-facing hyperparameters; this module only maps one onto
the other and rejects settings the fused kernels cannot honour.

Slots are matched by NAME: each binding says which of TensorFlow's slot names
(`config._slot_names()`) feeds which slot input of the fused op. The table is checked against
TensorFlow's slot names and the op library's slot inputs when this module is imported, so a
rename in either fails loudly instead of swapping slot values. `FusedOptimizer.slot_names` lists
TensorFlow's names in the order of the op's slot inputs (`FusedOptimizer.slot_inputs`), whatever
order TensorFlow lists them in.
"""
import dataclasses
import math
from typing import Callable, Dict, Tuple

import tensorflow as tf
from absl import logging

from tf_sc_embedding.ops import OPTIMIZERS
from tf_sc_embedding.ops.fused_update import fused_update_function
from tf_sc_embedding.optimizers.row_wise_adagrad import RowWiseAdagrad

_embedding = tf.tpu.experimental.embedding


@dataclasses.dataclass(frozen=True)
class _Binding:
    definition: str                                   # key into ops.OPTIMIZERS
    slots: Dict[str, str]                             # TF slot name -> slot input of the op
    # (config, embedding dim) -> the op's hyperparameter attributes
    hyperparameters: Callable[[object, int], Dict[str, object]]
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
    _embedding.SGD: _Binding("sgd", {}, lambda o, dim: {}),
    _embedding.Adagrad: _Binding(
        "adagrad", {"accumulators": "accumulator"}, lambda o, dim: {},
        lambda o: _positive("initial_accumulator_value", o.initial_accumulator_value, "Adagrad")),
    # The mean of the squared gradient runs over the table's dim columns, not its padded width.
    RowWiseAdagrad: _Binding(
        "row_wise_adagrad", {"accumulators": "accumulator"},
        lambda o, dim: dict(epsilon=float(o.epsilon), embedding_dim=int(dim)),
        lambda o: o.validate()),
    _embedding.AdagradMomentum: _Binding(
        "adagrad_momentum", {"accumulators": "accumulator", "momenta": "momenta"},
        lambda o, dim: dict(use_nesterov=bool(o.use_nesterov), exponent=float(o.exponent),
                       beta1=float(o.momentum), beta2=float(o.beta2), epsilon=float(o.epsilon)),
        lambda o: (_positive("epsilon", o.epsilon, "AdagradMomentum"),
                   _positive("exponent", o.exponent, "AdagradMomentum"))),
    _embedding.Adam: _Binding(
        "adam", {"momenta": "momenta", "velocities": "velocity"},
        lambda o, dim: dict(use_sum_inside_sqrt=bool(o.sum_inside_sqrt), beta1=float(o.beta_1),
                       beta2=float(o.beta_2), epsilon=float(o.epsilon)),
        _validate_adam),
    _embedding.FTRL: _Binding(
        "ftrl", {"accumulators": "accumulator", "linears": "linear"},
        lambda o, dim: dict(multiply_linear_by_learning_rate=bool(o.multiply_linear_by_learning_rate),
                       beta=float(o.beta), learning_rate_power=float(o.learning_rate_power),
                       l1_regularization_strength=float(o.l1_regularization_strength),
                       l2_regularization_strength=float(o.l2_regularization_strength)),
        lambda o: _positive("initial_accumulator_value", o.initial_accumulator_value, "FTRL")),
}


def _slot_mismatch(binding, tf_slot_names):
    """Why TensorFlow's slot names and the op's slot inputs do not match `binding.slots` by name
    (None if they do)."""
    op_slots = OPTIMIZERS[binding.definition].slots
    if sorted(tf_slot_names) != sorted(binding.slots):
        return (f"TensorFlow's slots are {tuple(tf_slot_names)}, the binding maps "
                f"{tuple(binding.slots)}")
    if sorted(binding.slots.values()) != sorted(op_slots):
        return (f"the fused op's slot inputs are {op_slots}, the binding maps to "
                f"{tuple(binding.slots.values())}")
    return None


def check_slot_bindings(bindings=None):
    """Raises ImportError unless every binding matches TensorFlow's slot names (from a default
    config of each class) and the op library's slot inputs exactly, by name."""
    bindings = _BINDINGS if bindings is None else bindings
    unbound = set(OPTIMIZERS) - {b.definition for b in bindings.values()}
    if bindings is _BINDINGS and unbound:
        raise ImportError(f"tf_sc_embedding: the op library's optimizers {sorted(unbound)} have "
                          "no TensorFlow config class bound to them")
    for cls, binding in bindings.items():
        problem = _slot_mismatch(binding, cls()._slot_names())  # pylint: disable=protected-access
        if problem:
            raise ImportError(f"tf_sc_embedding cannot bind tf.tpu.experimental.embedding."
                              f"{cls.__name__} to the fused '{binding.definition}' optimizer: "
                              f"{problem} (TensorFlow renamed or changed its slots?)")


check_slot_bindings()

# The one registry of the optimizers a user can pass: TensorFlow's config classes, by class name
# (.keras serialization, error messages); each is bound to one fused optimizer of the op library.
SUPPORTED_CONFIGS: Dict[str, type] = {cls.__name__: cls for cls in _BINDINGS}


@dataclasses.dataclass(frozen=True)
class FusedOptimizer:
    """Everything the embedding needs to create slots for a table and update it."""
    config: object                 # the user's TensorFlow optimizer config
    definition_name: str
    slot_names: Tuple[str, ...]    # TensorFlow's slot names, e.g. ("accumulators",), in the
                                   # order of the op's slot inputs
    slot_initializers: tuple       # parallel to slot_names
    slot_inputs: Tuple[str, ...]   # the op's slot input of each of slot_names, e.g. ("accumulator",)
    hyperparameters: Dict[str, object]
    clip_weight_min: float
    clip_weight_max: float

    def slot_width(self, slot_name, width):
        """Columns of slot `slot_name` (TensorFlow's name) for a table `width` columns wide:
        `width`, or 1 for a row-wise slot (the rule is the op library's)."""
        slot_input = self.slot_inputs[self.slot_names.index(slot_name)]
        return OPTIMIZERS[self.definition_name].slot_width(slot_input, width)

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


def fused_optimizer(config, where, dim):
    """Validates an optimizer config for a table of `dim` columns and binds it to a fused
    optimizer. Errors start with `where` (the table)."""
    binding = _BINDINGS.get(type(config))
    if binding is None:
        supported = ", ".join(n for n in SUPPORTED_CONFIGS if n != RowWiseAdagrad.__name__)
        raise ValueError(f"{where}: unsupported optimizer {type(config).__name__}; "
                         f"use one of tf.tpu.experimental.embedding.{{{supported}}} or "
                         "tf_sc_embedding.RowWiseAdagrad")
    if getattr(config, "weight_decay_factor", None) is not None:
        raise NotImplementedError(f"{where}: weight_decay_factor is not supported by the fused "
                                  "SparseCore optimizers (TensorFlow rejects it as well)")
    if getattr(config, "clip_gradient_min", None) is not None or \
            getattr(config, "clip_gradient_max", None) is not None:
        raise NotImplementedError(f"{where}: clipvalue (gradient clipping) is not supported by "
                                  "the fused SparseCore optimizers")
    try:
        binding.validate(config)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    # TensorFlow's own slot definitions, matched to the op's slot inputs by name.
    tf_slot_names = list(config._slot_names())  # pylint: disable=protected-access
    problem = _slot_mismatch(binding, tf_slot_names)
    if problem:
        raise ValueError(f"{where}: {type(config).__name__}: {problem}")
    initializer_of = dict(zip(tf_slot_names, config._slot_initializers()))  # pylint: disable=protected-access
    tf_name_of = {op_slot: tf_name for tf_name, op_slot in binding.slots.items()}
    slot_inputs = OPTIMIZERS[binding.definition].slots
    slot_names = tuple(tf_name_of[s] for s in slot_inputs)
    clip_min = -math.inf if config.clip_weight_min is None else float(config.clip_weight_min)
    clip_max = math.inf if config.clip_weight_max is None else float(config.clip_weight_max)
    return FusedOptimizer(config, binding.definition, slot_names,
                          tuple(initializer_of[n] for n in slot_names), slot_inputs,
                          binding.hyperparameters(config, dim), clip_min, clip_max)
