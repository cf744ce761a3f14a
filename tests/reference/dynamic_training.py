"""Pure-numpy reference of training steps of open-vocabulary tables (docs/dynamic_vocabulary.md),
composed of the map's reference (tests/reference/key_row_map.py) and the whole-step reference of
fixed tables (tests/api/reference_training.py).

The state is logical: per key, its values and slots. A step maps every occurrence of every
feature of a table in one call (feature order, then sample order); an occurrence without a row
reads a zero row whose update is discarded; a key admitted in the step starts from the
initializer's constant and the slots' initial values.
"""
import numpy as np

from tests.api import reference_training as ref
from tests.reference.key_row_map import ReferenceKeyRowMap

SCRATCH = -1   # the logical id of the zero row read by occurrences without a row


class ReferenceDynamicTable:
    """pipelined: each step's update is applied one step late, after the next step's lookup
    (docs/pipelining.md), and `flush` applies the last one; a key the kept update writes still
    holds its row then (it was seen at the step before)."""

    def __init__(self, capacity, dim, optimizer, initial_value, admission_threshold=1,
                 steps_to_live=0, pending_capacity=None, pipelined=False):
        self.map = ReferenceKeyRowMap(capacity, admission_threshold, steps_to_live,
                                      pending_capacity)
        self.dim = dim
        self.optimizer = optimizer
        self.initial_value = np.float32(initial_value)
        self.values = {}    # key -> [dim]
        self.slots = {}     # key -> {slot: row}
        self.step = -1
        self.counters = dict(admitted_keys=0, refused_keys=0, unadmitted_ids=0)
        self.pipelined = pipelined
        self.kept = None    # (features over keys, None for no row; their gradients)
        self.kept_step = -1  # the step whose update is kept

    def train_step(self, features, gradients_of):
        """One step. features: {feature name: reference_training.Feature over keys};
        gradients_of(activations) -> {feature name: [batch, dim]}. Returns the activations."""
        by_key = self.map_only(features)
        table, _, renumbered = self._gathered(by_key)
        activations = ref.forward({"t": table}, renumbered)
        gradients = gradients_of(activations)
        if self.pipelined:
            self.flush()
            self.kept = (by_key, gradients)
            self.kept_step = self.step
        else:
            self._apply(by_key, gradients)
        return activations

    def map_only(self, features):
        """Maps one step's keys (the lookup of a step whose update never comes: a dropped
        prefetched lookup); returns the features over keys (None: no row). Pipelined, a step
        more than one past the kept update's step applies that update first
        (exchanges/dynamic.py, _settle_kept_update)."""
        self.step += 1
        if self.kept is not None and self.step > self.kept_step + 1:
            self.flush()
        keys = [k for f in features.values() for ids in f.ids for k in ids]
        has_row, admitted, stats = self.map.map_step(keys, self.step)
        for name in self.counters:
            self.counters[name] += stats[name]
        for key in admitted:
            self.values[key] = np.full(self.dim, self.initial_value, np.float32)
            self.slots[key] = {name: row[0] for name, row in ref.initial_slots(
                self.optimizer, (1, self.dim)).items()}
        self._forget_expired()
        flags = iter(has_row)
        return {name: ref.Feature("t", feature.combiner,
                                  [[k if next(flags) else None for k in sample]
                                   for sample in feature.ids], feature.weights)
                for name, feature in features.items()}

    def flush(self):
        """Applies the kept update (pipelined), if any."""
        if self.kept is not None:
            self._apply(*self.kept)
            self.kept = None

    def _gathered(self, by_key):
        """(table [held keys + 1, dim], slots, features renumbered) of the held keys, in key
        order, with a zero row last for the occurrences without a row."""
        held = sorted(self.values)
        index = {k: i for i, k in enumerate(held)}
        scratch = len(held)
        renumbered = {name: ref.Feature("t", f.combiner,
                                        [[scratch if k is None else index[k] for k in sample]
                                         for sample in f.ids], f.weights)
                      for name, f in by_key.items()}
        table = np.zeros((scratch + 1, self.dim), np.float32)
        slot_names = ref.optimizer_definition(self.optimizer).slot_names
        slots = {s: np.zeros((scratch + 1, self.slot_width(s)), np.float32) for s in slot_names}
        for k, i in index.items():
            table[i] = self.values[k]
            for s in slot_names:
                slots[s][i] = self.slots[k][s]
        return table, slots, renumbered

    def _apply(self, by_key, gradients):
        table, slots, renumbered = self._gathered(by_key)
        tables, new_slots = ref.apply_gradients({"t": table}, {"t": slots},
                                                {"t": self.optimizer}, renumbered, gradients)
        for i, k in enumerate(sorted(self.values)):
            self.values[k] = tables["t"][i]
            for s in slots:
                self.slots[k][s] = new_slots["t"][s][i]

    def slot_width(self, slot):
        definition = ref.optimizer_definition(self.optimizer)
        return 1 if definition.name == "row_wise_adagrad" else self.dim

    def _forget_expired(self):
        live = set(self.map.export()[1])
        for key in list(self.values):
            if key not in live:
                del self.values[key]
                del self.slots[key]

    def export(self):
        """(keys ascending, values [n, dim]) (pipelined: after the kept update)."""
        self.flush()
        keys = sorted(self.values)
        values = (np.stack([self.values[k] for k in keys]) if keys
                  else np.zeros((0, self.dim), np.float32))
        return keys, values
