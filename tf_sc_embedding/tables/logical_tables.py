"""`LogicalTables`: the user tables as logical [vocabulary_size, dim] values, built or not.

Checkpoints, Keras weight files, the serving export and the Keras layer's re-layout all see the
tables through this one view, so none of them asks whether the tables exist yet:

* before `build()`, a restore is kept (`restore` stores arrays or chunk readers) and `build()`
  creates the variables from it; saving then carries the kept values forward;
* after `build()`, reads flush a pipelined update first and come from `TableStorage`, and a
  restore writes into the variables (dropping any kept pipelined update: it belonged to the
  replaced tables).

It is also the one home of the restore-validation rule (`check_restorable`), used by checkpoints
and Keras weight files alike.
"""
import contextlib
import threading

import tensorflow as tf
from absl import logging

from tf_sc_embedding.tables.table_storage import PARAMETERS, PendingRestore

_options = threading.local()


@contextlib.contextmanager
def allow_optimizer_change():
    """Restores inside this block accept a source without some optimizer slots.

    Use it when the optimizer was changed on purpose between saving and restoring: the slots the
    source does not have keep their initial values (a warning names each). Without it a missing
    slot is an error and nothing is restored.
    """
    previous = getattr(_options, "allow_missing_slots", False)
    _options.allow_missing_slots = True
    try:
        yield
    finally:
        _options.allow_missing_slots = previous


class LogicalTables:
    """Every user table of one embedding, by name, as logical values (see the module docstring)."""

    def __init__(self, tables):
        """tables: {table name: (TableConfig, its optimizers.FusedOptimizer)}."""
        self._configs = {name: config for name, (config, _) in tables.items()}
        self._optimizers = {name: optimizer for name, (_, optimizer) in tables.items()}
        self._kinds = {name: (PARAMETERS,) + tuple(optimizer.slot_names)
                       for name, (_, optimizer) in tables.items()}
        self._pending = PendingRestore()
        self._lock = threading.Lock()
        self._storage = None
        self._flush = self._discard = None

    # ------------------------------------------------------------------ what the tables are
    @property
    def names(self):
        return tuple(self._configs)

    def config(self, name):
        return self._configs[self._known(name)]

    def shape(self, name, kind=PARAMETERS):
        """(vocabulary_size, dim) of a table's parameters; a slot's is (vocabulary_size, dim), or
        (vocabulary_size, 1) for a row-wise slot (FusedOptimizer.slot_width)."""
        config = self.config(name)
        dim = int(config.dim)
        if kind != PARAMETERS:
            if kind not in self.kinds(name):
                raise KeyError(f"table '{name}' has no slot '{kind}'; its optimizer's slots are "
                               f"{list(self.kinds(name)[1:])}")
            dim = self._optimizers[name].slot_width(kind, dim)
        return (int(config.vocabulary_size), dim)

    def kinds(self, name):
        """("parameters", <slot names>...) of a table."""
        return self._kinds[self._known(name)]

    def name_of(self, table_config):
        for name, config in self._configs.items():
            if config is table_config:
                return name
        raise KeyError(f"unknown table {table_config}")

    def _known(self, name):
        if name not in self._configs:
            raise KeyError(f"unknown table '{name}'; the tables are {sorted(self._configs)}")
        return name

    # ------------------------------------------------------------------ building
    @property
    def built(self):
        return self._storage is not None

    def build(self, create_storage):
        """Creates the tables once: create_storage(initial) -> (storage, flush, discard).

        `initial(name, kind)` is the chunk reader of a kept restore (or None), which the storage
        uses instead of the initializer; flush() applies a pipelined update before reads and
        discard() drops it before a restore writes. Returns whether this call built them.
        """
        with self._lock:
            if self._storage is not None:
                return False
            storage, self._flush, self._discard = create_storage(self._pending.reader)
            self._storage = storage
            self._pending.clear()
            return True

    # ------------------------------------------------------------------ reading
    def read(self, name, kind=PARAMETERS):
        """The logical value of a built table's parameters or slot: numpy eagerly, a tensor
        while tracing. With several worker processes an eager read is collective."""
        if not self.built:
            raise RuntimeError(f"table '{name}' is not built yet: call build(), "
                               "embedding_lookup() or enqueue() first")
        self._flush()
        if tf.executing_eagerly():
            return self._storage.read_logical(self._known(name), kind)
        return self._storage.read_logical_tf(self._known(name), kind)

    def has_value(self, name, kind):
        """Whether saving has a value for a table's parameters or slot (built, or restored)."""
        return self.built or self._pending.reader(self._known(name), kind) is not None

    def saved_value(self, name, kind):
        """What saving writes for a table's parameters or slot now: the built value, or the kept
        restore of a table not built yet (None if there is none: nothing to save)."""
        if self.built:
            return self.read(name, kind)
        reader = self._pending.reader(self._known(name), kind)
        return None if reader is None else reader(0, self.shape(name)[0])

    # ------------------------------------------------------------------ restoring
    def restore(self, values):
        """Writes logical values now, or at build() when the tables do not exist yet.

        values: {table name: {kind: numpy array, or a chunk reader (first_row, stop) -> rows}},
        validated by the caller (check_restorable). A later restore wins per table and kind.
        """
        with self._lock:
            if self._storage is None:
                self._pending.add(values)
                return
        with tf.init_scope():
            self._discard()
            for name, kinds in values.items():
                for kind, value in kinds.items():
                    self._storage.write_logical(name, kind, value)


def check_restorable(tables, available, source, complete=False, location="", names=None):
    """The one rule restores follow, before anything is written (checkpoints, weight files).

    tables: the LogicalTables being restored into; available: {table name: {kind: shape}} of the
    tables the source holds. A table the source does not name is not restored, unless the source
    claims to be `complete` (a Keras weights file holds the whole layer). A restored table needs
    its parameters, and every slot of its optimizer unless allow_optimizer_change() is active
    (then a missing slot keeps its initial value); every shape must be `tables.shape`'s (the
    TableConfig's, [vocabulary_size, 1] for a row-wise slot). Under allow_optimizer_change() a
    slot of the same name but another optimizer's width (Adagrad's accumulators restored into
    row-wise Adagrad, or back) is skipped like a missing one.
    source names the source in errors ("the checkpoint"); location is appended (its path).
    names: the tables a complete source must hold (default: all; open-vocabulary tables are
    restored from their logical state instead, dynamic_tables.py).
    Returns {table name: kinds to restore}: the caller restores those and nothing else.
    """
    allow_missing = getattr(_options, "allow_missing_slots", False)
    missing = [name for name in (tables.names if names is None else names)
               if name not in available]
    if complete and missing:
        raise ValueError(f"{source}{location} has no table {missing[0]!r} (missing: "
                         f"{missing}). Nothing was restored")
    restorable = {}
    for name, kinds in available.items():
        restorable[name] = set()
        if PARAMETERS not in kinds:
            raise ValueError(f"table '{name}': {source}{location} has optimizer slots but no "
                             "parameters. "
                             "Nothing was restored")
        for kind in tables.kinds(name):
            if kind not in kinds:
                if not allow_missing:
                    raise ValueError(
                        f"table '{name}': {source}{location} has no '{kind}' slot, which the "
                        "table's optimizer needs (saved with another optimizer?). Nothing was restored. "
                        "To change the optimizer on purpose, restore inside "
                        "tf_sc_embedding.saving.checkpointing.allow_optimizer_change(): missing slots "
                        "then keep their initial values")
                logging.warning("%s%s has no slot '%s' for table '%s': the slot keeps its "
                                "initial value", source, location, kind, name)
                continue
            expected = tables.shape(name, kind)
            if tuple(kinds[kind]) != expected:
                if allow_missing and kind != PARAMETERS and \
                        tuple(kinds[kind])[:1] == expected[:1] == tuple(kinds[PARAMETERS])[:1]:
                    logging.warning("%s%s's slot '%s' of table '%s' has shape %s, this "
                                    "optimizer's %s (another optimizer's slot): it keeps its "
                                    "initial value", source, location, kind, name,
                                    list(kinds[kind]), list(expected))
                    continue
                what = ("[vocabulary_size, dim]" if expected[1] == tables.shape(name)[1] else
                        "[vocabulary_size, 1]: the optimizer's slot is row-wise")
                raise ValueError(
                    f"table '{name}': {source}'s {kind} has shape {list(kinds[kind])}, the "
                    f"TableConfig {list(expected)} ({what}){location}; a table "
                    "with a different vocabulary or dimension, or a slot of another optimizer, "
                    "cannot be restored. Nothing was restored" +
                    ("" if kind == PARAMETERS else
                     ". To change the optimizer on purpose, restore inside "
                     "tf_sc_embedding.saving.checkpointing.allow_optimizer_change()"))
            restorable[name].add(kind)
    return restorable
