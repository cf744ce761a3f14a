"""Pure-numpy reference of whole TPUEmbeddingV2 training steps on LOGICAL tables.

Nothing here knows about stacking, sharding, replicas or CSR buffers: a step is written directly
from the spec's semantics on the user's [vocabulary_size, dim] tables and the *global* batch
(all replicas' samples concatenated in replica order).

* docs/preprocessing.md#combiners combiners: per sample, gain_t = w_t (sum), w_t / sum(w) (mean), w_t / sqrt(sum(w^2))
  (sqrtn); a sample whose scale is 0 gets gain 0.
* Forward: activation[b] = sum over the sample's ids of gain * table[id] (the pre-update table).
* docs/optimizers.md#gradient-accumulation backward: for every table row, G[row] = sum of gain * dA[b] over every feature using the
  table and every sample of the global batch; then ONE optimizer step per touched row, with the
  per-row math of `tests/reference/lookup.py` (docs/optimizers.md#per-row-formulas, float32, clip of the new table row);
  untouched rows and their slots are unchanged (so Adam is lazy, no bias correction).
* docs/optimizers.md#slots slot initial values.

The optimizer is described by TensorFlow's own config object
(`tf.tpu.experimental.embedding.SGD`, ...); `optimizer_definition` maps it onto the reference's
per-row step, independently of the library's own binding.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from tests.reference import lookup as ref_lookup

f32 = np.float32


# --------------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OptimizerDefinition:
    name: str                      # key of reference.lookup.OPTIMIZER_STEPS
    slot_names: tuple              # TensorFlow's slot names, in the per-row step's slot order
    slot_initial_values: tuple     # docs/optimizers.md#slots
    hyperparameters: dict          # the op attribute names the per-row step reads
    clip_min: float
    clip_max: float


def optimizer_definition(config):
    """(step, slots, hyperparameters, clipping) of a tf.tpu.experimental.embedding optimizer."""
    kind = type(config).__name__
    clip_min = -math.inf if config.clip_weight_min is None else float(config.clip_weight_min)
    clip_max = math.inf if config.clip_weight_max is None else float(config.clip_weight_max)
    if kind == "SGD":
        return OptimizerDefinition("sgd", (), (), {}, clip_min, clip_max)
    if kind == "Adagrad":
        return OptimizerDefinition("adagrad", ("accumulators",),
                                   (config.initial_accumulator_value,), {}, clip_min, clip_max)
    if kind == "RowWiseAdagrad":
        return OptimizerDefinition("row_wise_adagrad", ("accumulators",),
                                   (config.initial_accumulator_value,),
                                   dict(epsilon=config.epsilon), clip_min, clip_max)
    if kind == "AdagradMomentum":
        return OptimizerDefinition(
            "adagrad_momentum", ("accumulators", "momenta"), (0.0, 0.0),
            dict(use_nesterov=bool(config.use_nesterov), exponent=config.exponent,
                 beta1=config.momentum, beta2=config.beta2, epsilon=config.epsilon),
            clip_min, clip_max)
    if kind == "Adam":
        return OptimizerDefinition(
            "adam", ("momenta", "velocities"), (0.0, 0.0),
            dict(use_sum_inside_sqrt=bool(config.sum_inside_sqrt), beta1=config.beta_1,
                 beta2=config.beta_2, epsilon=config.epsilon),
            clip_min, clip_max)
    if kind == "FTRL":
        return OptimizerDefinition(
            "ftrl", ("accumulators", "linears"), (config.initial_accumulator_value, 0.0),
            dict(multiply_linear_by_learning_rate=bool(config.multiply_linear_by_learning_rate),
                 beta=config.beta, learning_rate_power=config.learning_rate_power,
                 l1_regularization_strength=config.l1_regularization_strength,
                 l2_regularization_strength=config.l2_regularization_strength),
            clip_min, clip_max)
    raise ValueError(f"no reference for optimizer {kind}")


def initial_slots(config, shape):
    """{slot name: initial logical slot} of an optimizer config (docs/optimizers.md#slots).
    Row-wise Adagrad's one slot holds one value per row: [vocabulary_size, 1]."""
    definition = optimizer_definition(config)
    if definition.name == "row_wise_adagrad":
        shape = (shape[0], 1)
    return {name: np.full(shape, value, np.float32)
            for name, value in zip(definition.slot_names, definition.slot_initial_values)}


def current_learning_rate(config):
    lr = config.learning_rate
    value = lr() if callable(lr) else lr
    return f32(np.asarray(value, np.float32))


# --------------------------------------------------------------------------------------------
# Features and combiners
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Feature:
    """One feature's global batch: per sample, its ids and (optional) weights."""
    table: str
    combiner: str
    ids: List[List[int]]
    weights: Optional[List[List[float]]] = None

    def sample_weights(self, b):
        if self.weights is None:
            return [f32(1.0)] * len(self.ids[b])
        return [f32(w) for w in self.weights[b]]


def combiner_gains(ids: Sequence[int], weights: Sequence[float], combiner: str):
    """docs/preprocessing.md#combiners: the gain of every id of one sample."""
    weights = [f32(w) for w in weights]
    if combiner == "sum":
        return weights
    if combiner == "mean":
        scale = f32(0.0)
        for w in weights:
            scale = f32(scale + w)
        scale = f32(0.0) if scale == 0 else f32(1.0 / np.float64(scale))
    elif combiner == "sqrtn":
        scale = f32(0.0)
        for w in weights:
            scale = f32(scale + w * w)
        scale = f32(0.0) if scale == 0 else f32(1.0 / np.float64(np.sqrt(scale)))
    else:
        raise ValueError(f"unknown combiner {combiner}")
    return [f32(w * scale) for w in weights]


def feature_entries(feature: Feature):
    """[(sample, id, gain)] of every id of every sample, in input order."""
    out = []
    for b, ids in enumerate(feature.ids):
        for i, g in zip(ids, combiner_gains(ids, feature.sample_weights(b), feature.combiner)):
            out.append((b, int(i), g))
    return out


# --------------------------------------------------------------------------------------------
# Training step
# --------------------------------------------------------------------------------------------

def forward(tables: Dict[str, np.ndarray], features: Dict[str, Feature]):
    """{feature key: [global batch, dim] activations} from the (pre-update) logical tables."""
    result = {}
    for key, feature in features.items():
        table = np.asarray(tables[feature.table], np.float32)
        act = np.zeros((len(feature.ids), table.shape[1]), np.float32)
        for b, i, g in feature_entries(feature):
            act[b] = act[b] + g * table[i]
        result[key] = act
    return result


def summed_gradients(tables, features: Dict[str, Feature], gradients: Dict[str, np.ndarray]):
    """{table: {row: G[row]}}: duplicates across samples, features (and replicas) summed."""
    sums = {name: {} for name in tables}
    for key, feature in features.items():
        dim = tables[feature.table].shape[1]
        grad = gradients.get(key)
        grad = (np.zeros((len(feature.ids), dim), np.float32) if grad is None
                else np.asarray(grad, np.float32).reshape(len(feature.ids), dim))
        rows = sums[feature.table]
        for b, i, g in feature_entries(feature):
            rows[i] = rows.get(i, np.zeros(dim, np.float32)) + g * grad[b]
    return sums


def apply_gradients(tables, slots, optimizers, features, gradients, learning_rates=None):
    """One fused update of every table; returns (new tables, new slots).

    `optimizers[table]` is the table's TF optimizer config, `slots[table]` its {slot name:
    logical slot}; `learning_rates[table]` overrides the config's learning rate (for callables).
    """
    new_tables = {k: np.array(v, np.float32, copy=True) for k, v in tables.items()}
    new_slots = {k: {s: np.array(v, np.float32, copy=True) for s, v in d.items()}
                 for k, d in slots.items()}
    for name, rows in summed_gradients(tables, features, gradients).items():
        config = optimizers[name]
        definition = optimizer_definition(config)
        step = ref_lookup.OPTIMIZER_STEPS[definition.name]
        lr = (learning_rates or {}).get(name)
        lr = current_learning_rate(config) if lr is None else f32(lr)
        table = new_tables[name]
        table_slots = [new_slots[name][s] for s in definition.slot_names]
        for row, g in rows.items():
            w, s = step(np.asarray(g, np.float32), table[row].copy(),
                        [x[row].copy() for x in table_slots], lr, definition.hyperparameters,
                        definition.clip_min, definition.clip_max)
            table[row] = w
            for x, value in zip(table_slots, s):
                x[row] = value
    return new_tables, new_slots


def touched_rows(features: Dict[str, Feature]):
    """{table: sorted rows referenced by at least one id}."""
    rows = {}
    for feature in features.values():
        rows.setdefault(feature.table, set()).update(i for _, i, _ in feature_entries(feature))
    return {k: sorted(v) for k, v in rows.items()}
