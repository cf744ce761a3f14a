"""The tables in Keras weight files (`model.save`, `save_weights`, `ModelCheckpoint`, ...).

`EmbeddingLayer.save_own_variables` / `load_own_variables` store every table's logical parameters
and slots under `table:<name>:<kind>`, read and written through the embedding's logical tables
view, so a file written by one topology loads into any other, built or not. An open-vocabulary
table stores its logical state instead (dynamic_tables.py), under `dynamic:<name>:<part>`;
string keys as their bytes, concatenated, and their lengths (HDF5 strings would lose trailing
NUL bytes).
"""
import numpy as np

from tf_sc_embedding.tables import logical_tables
from tf_sc_embedding.tables.dynamic_tables import value_part

TRIGGER_KEY = "trigger"
_TABLE_KEY = "table:{table}:{kind}"
_DYNAMIC_KEY = "dynamic:{table}:{part}"


def _keys(tables, dynamic=()):
    return [(name, kind, _TABLE_KEY.format(table=name, kind=kind))
            for name in tables.names if name not in dynamic for kind in tables.kinds(name)]


def save_tables(store, tables, dynamic=None):
    """Writes every table's parameters and slots that have a value (logical_tables view), and
    the logical state of every table of `dynamic` (dynamic_tables.DynamicTables)."""
    names = dynamic.names if dynamic is not None else ()
    for name, kind, key in _keys(tables, names):
        if tables.has_value(name, kind):
            store[key] = tables.saved_value(name, kind)
    for name in names:
        for part, value in dynamic.logical_state(name).items():
            if part == "keys" and value.dtype == object:   # string keys
                encoded = [bytes(k) for k in value]
                store[_DYNAMIC_KEY.format(table=name, part="key_bytes")] = np.frombuffer(
                    b"".join(encoded), np.uint8)
                store[_DYNAMIC_KEY.format(table=name, part="key_lengths")] = np.array(
                    [len(k) for k in encoded], np.int64)
            else:
                store[_DYNAMIC_KEY.format(table=name, part=part)] = value


def _dynamic_state(store, keys, name, kinds):
    """The logical state of dynamic table `name` (with parameters and slots `kinds`) in a
    weights store, or None."""
    names = ("last_step", "keys", "key_bytes", "key_lengths", "last_seen", "pending_keys",
             "pending_counts", "pending_last_seen") + tuple(value_part(kind) for kind in kinds)
    parts = {part: np.asarray(store[_DYNAMIC_KEY.format(table=name, part=part)])
             for part in names if _DYNAMIC_KEY.format(table=name, part=part) in keys}
    if not parts:
        return None
    if "key_bytes" in parts:
        data = parts.pop("key_bytes").tobytes()
        ends = np.cumsum(parts.pop("key_lengths"))
        parts["keys"] = np.array([data[a:b] for a, b in zip(np.concatenate([[0], ends[:-1]]),
                                                              ends)], dtype=object)
    return parts


def load_tables(store, tables, dynamic=None):
    """Validated as checkpoints are (logical_tables.check_restorable, the file holding the
    whole layer) before any table is written.

    Keras's store reads a whole array per key. Into built tables the arrays are read one at a
    time (once for the shape check, once to write), so memory holds one table; before build()
    they are kept until the tables exist (the file is closed by then).
    """
    keys = set(store.keys())
    names = dynamic.names if dynamic is not None else ()
    states = {name: _dynamic_state(store, keys, name, dynamic.table(name).kinds)
              for name in names}
    missing = [name for name, state in states.items() if state is None]
    if missing:
        raise ValueError(f"the weights file has no open-vocabulary table {missing[0]!r} "
                         f"(missing: {missing}). Nothing was restored")
    for name, state in states.items():   # checked before anything is written
        dynamic.check(name, state, "the weights file")
    available, kept = {}, {}
    for name, kind, key in _keys(tables, names):
        if key in keys:
            value = np.asarray(store[key])
            available.setdefault(name, {})[kind] = tuple(value.shape)
            if not tables.built:
                kept[key] = value
            del value
    restorable = logical_tables.check_restorable(
        tables, available, "the weights file", complete=True,
        names=[name for name in tables.names if name not in names])
    for name, state in states.items():
        dynamic.restore(name, state, "the weights file")
    for name, kind, key in _keys(tables, names):
        if kind in restorable.get(name, ()):
            value = kept.pop(key) if key in kept else np.asarray(store[key])
            tables.restore({name: {kind: value}})
            del value
