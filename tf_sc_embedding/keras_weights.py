"""The tables in Keras weight files (`model.save`, `save_weights`, `ModelCheckpoint`, ...).

`EmbeddingLayer.save_own_variables` / `load_own_variables` store every table's logical parameters
and slots under `table:<name>:<kind>`, read and written through the embedding's logical tables
view, so a file written by one topology loads into any other, built or not.
"""
import numpy as np

from tf_sc_embedding import logical_tables

TRIGGER_KEY = "trigger"
_TABLE_KEY = "table:{table}:{kind}"


def _keys(tables):
    return [(name, kind, _TABLE_KEY.format(table=name, kind=kind))
            for name in tables.names for kind in tables.kinds(name)]


def save_tables(store, tables):
    """Writes every table's parameters and slots that have a value (logical_tables view)."""
    for name, kind, key in _keys(tables):
        if tables.has_value(name, kind):
            store[key] = tables.saved_value(name, kind)


def load_tables(store, tables):
    """Validated as checkpoints are (logical_tables.check_restorable, the file holding the
    whole layer) before any table is written.

    Keras's store reads a whole array per key. Into built tables the arrays are read one at a
    time (once for the shape check, once to write), so memory holds one table; before build()
    they are kept until the tables exist (the file is closed by then).
    """
    keys = set(store.keys())
    available, kept = {}, {}
    for name, kind, key in _keys(tables):
        if key in keys:
            value = np.asarray(store[key])
            available.setdefault(name, {})[kind] = tuple(value.shape)
            if not tables.built:
                kept[key] = value
            del value
    restorable = logical_tables.check_restorable(tables, available, "the weights file",
                                                 complete=True)
    for name, kind, key in _keys(tables):
        if kind in restorable.get(name, ()):
            value = kept.pop(key) if key in kept else np.asarray(store[key])
            tables.restore({name: {kind: value}})
            del value
