"""The open-vocabulary tables of one embedding: their key-to-row maps, counters and logical state
(docs/dynamic_vocabulary.md).

`DynamicTables` is created with the embedding, before any variable exists, so a restore before
`build()` can import a map's state at once. It owns, per dynamic table (`DynamicTable`):

* the key-to-row map (ops.key_row_map.KeyRowMap) and the counters of what it refused;
* the step's key mapping (`map_keys`) and the rows that must be reset before the lookup reads
  them (`reset_rows`), used by exchanges/dynamic.py;
* the logical state (sorted keys with their rows, slots, last-seen steps and the pending
  admission counts) that `export_dynamic_table` returns and checkpoints save (`DynamicTableNode`).

The table's rows are the variables of `TableStorage`, read and written through `LogicalTables`;
physical rows never leave this module: the logical state is ordered by key.
"""
import weakref

import numpy as np
import tensorflow as tf

from tf_sc_embedding import dynamic_vocabulary
from tf_sc_embedding import fused_update
from tf_sc_embedding import private_tf
from tf_sc_embedding.ops.key_row_map import (STRING_STEP_STATS, KeyRowMap, KeyRowMapState,
                                              StringKeyRowMapState)
from tf_sc_embedding.table_storage import PARAMETERS, constant_initializer_value

# Counters kept per table, summed over the steps (STRING_STEP_STATS's order; int64 keys have no
# collisions, their last counter stays 0).
COUNTERS = STRING_STEP_STATS
# The checkpoint tensors of a table's logical state besides its values and slots.
_STATE_KEYS = ("last_step", "keys", "last_seen", "pending_keys", "pending_counts",
               "pending_last_seen")


class DynamicTable:
    """One open-vocabulary table: its map, counters and the rules of its rows."""

    def __init__(self, name, table_config, vocabulary, optimizer):
        """table_config: the user's TableConfig (vocabulary_size = rows held); optimizer: its
        optimizers.FusedOptimizer."""
        self.name = name
        self.vocabulary = vocabulary
        self.capacity = int(table_config.vocabulary_size)
        self.dim = int(table_config.dim)
        self.scratch_row = self.capacity   # the one row beyond the capacity (SCRATCH_ROWS)
        self.initializer = table_config.initializer
        dynamic_vocabulary.check_initializer(name, self.initializer)
        self.kinds = (PARAMETERS,) + tuple(optimizer.slot_names)
        self.slot_values = {}
        for kind, initializer in zip(optimizer.slot_names, optimizer.slot_initializers):
            value = constant_initializer_value(initializer)
            if value is None:
                raise ValueError(f"table '{name}': a dynamic table resets the slots of reused "
                                 f"rows to their constant initial value; slot '{kind}' has none")
            self.slot_values[kind] = value
        self.seed = fused_update.table_seed(name)
        self.map = KeyRowMap(name, **vocabulary.map_arguments(self.capacity))
        with tf.init_scope(), tf.device("CPU:0"):
            self.counters = tf.Variable(tf.zeros([len(COUNTERS)], tf.int64), trainable=False,
                                        name=f"{name}_dynamic_counters")

    @property
    def key_dtype(self):
        return self.vocabulary.key_dtype

    # ----------------------------------------------------------------- a step
    def map_keys(self, keys):
        """(rows int32 [n], rows to reset int32 [k], step int64) of one step's keys ([n], every
        occurrence in batch order): an occurrence without a row reads the scratch row. The rows
        to reset are this step's new rows, after any of an earlier step whose writes never ran
        (confirm_reset confirms them once written)."""
        step = self.map.sizes()[2] + 1
        mapped = self.map.map_step(keys, step)
        stats = mapped.stats
        if stats.shape[0] != len(COUNTERS):
            stats = tf.pad(stats, [[0, len(COUNTERS) - int(stats.shape[0])]])
        counted = self.counters.assign_add(stats)
        with tf.control_dependencies([counted]):
            rows = tf.where(mapped.rows < 0, tf.constant(self.scratch_row, tf.int32),
                            mapped.rows)
        with tf.control_dependencies([mapped.rows]):
            to_reset = self.map.rows_to_reset()
        return rows, to_reset, step

    def confirm_reset(self, rows, writes):
        """Confirms `rows` (map_keys' rows to reset) once `writes` have run."""
        with tf.control_dependencies(writes):
            return self.map.confirm_reset(tf.size(rows))

    def find_keys(self, keys):
        """(rows int32 [n], rows to reset, step) of keys read without changing the map's keys
        (inference): a key without a row reads the scratch row. Rows an aborted training step
        left unreset are reset now (seeded by the last step)."""
        rows = self.map.find(keys)
        rows = tf.where(rows < 0, tf.constant(self.scratch_row, tf.int32), rows)
        return rows, self.map.rows_to_reset(), self.map.sizes()[2]

    def rows_to_write(self, new_rows):
        """int32 [k + 1]: the rows written before the lookup, for every kind alike: the rows to
        reset (map_keys' or find_keys'), then the scratch row."""
        return tf.concat([new_rows, [self.scratch_row]], axis=0)

    def reset_values(self, new_rows, step, kind, width):
        """float32 [k + 1, width], the values rows_to_write gets for one kind: each new row's
        initial values (or its slot's initial value), and the scratch row's (zeros)."""
        count = tf.size(new_rows)
        if kind == PARAMETERS:
            seed = tf.stack([tf.constant(self.seed, tf.int64), step])
            fresh = dynamic_vocabulary.initial_rows(self.initializer, count, width, seed)
            return tf.concat([fresh, tf.zeros([1, width], tf.float32)], axis=0)
        return tf.fill(tf.stack([count + 1, width]), self.slot_values[kind])

    def check_keys(self, ids, path):
        """The keys of one feature ([n] values of a dense, ragged or sparse input) as the map
        takes them; the wrong dtype fails naming the feature and the table."""
        values = (ids.flat_values if isinstance(ids, tf.RaggedTensor) else
                  ids.values if isinstance(ids, tf.SparseTensor) else tf.convert_to_tensor(ids))
        want = self.key_dtype
        if values.dtype == want or (want == tf.int64 and values.dtype == tf.int32):
            return tf.reshape(tf.cast(values, want) if values.dtype != want else values, [-1])
        raise ValueError(f"feature '{path}': table '{self.name}' has a dynamic vocabulary of "
                         f"{want.name} keys; got {values.dtype.name} ids")

    # ----------------------------------------------------------------- logical state
    def export_state(self):
        """The map's state now (eager): KeyRowMapState or StringKeyRowMapState of numpy arrays."""
        state = self.map.export()
        return type(state)(*[np.asarray(t) for t in state])

    def logical_state(self, read, widths):
        """{checkpoint name: numpy} of the table: keys ascending with their values, slots and
        last-seen steps, the pending counts and the last step. read(kind) -> [capacity + 1, w]
        numpy, the physical rows (or None when there are none yet); widths: {kind: w}."""
        state = self.export_state()
        rows = state.rows.astype(np.int64)
        result = {"last_step": np.asarray(state.last_step, np.int64), "keys": state.keys,
                  "last_seen": state.last_seen,
                  "pending_keys": (state.pending_fingerprints
                                   if isinstance(state, StringKeyRowMapState)
                                   else state.pending_keys),
                  "pending_counts": state.pending_counts,
                  "pending_last_seen": state.pending_last_seen}
        for kind in self.kinds:
            physical = read(kind)
            if physical is None:
                if len(rows):
                    raise RuntimeError(f"table '{self.name}': its rows are not built")
                physical = np.zeros((0, widths[kind]), np.float32)
            result[value_part(kind)] = np.asarray(physical, np.float32)[rows]
        return result

    def check_logical_state(self, state, widths, source):
        """Fails naming the table, before anything changes, when a logical state does not fit
        this table: more keys than the capacity, keys this configuration has expired, pending
        counts it cannot hold, keys of another dtype, or values or slots of another shape. The
        map's import checks the rest (order, ranges) and changes nothing when they fail."""
        def fail(problem):
            raise ValueError(f"table '{self.name}': {source} {problem}. Nothing was restored")

        missing = [part for part in _STATE_KEYS if part not in state]
        if missing:
            fail(f"has no {missing}")
        count = len(state["keys"])
        if count > self.capacity:
            fail(f"holds {count} keys, more than its capacity of {self.capacity} rows "
                 "(TableConfig.vocabulary_size)")
        strings = np.asarray(state["keys"]).dtype == object
        if count and strings != (self.key_dtype == tf.string):
            fail(f"holds {'string' if strings else 'int64'} keys, the table "
                 f"{self.key_dtype.name} keys")
        last_step = int(np.asarray(state["last_step"]))
        last_seen = np.asarray(state["last_seen"], np.int64)
        ttl = int(self.vocabulary.steps_to_live or 0)
        if ttl and count and np.any(last_step - last_seen > ttl):
            fail(f"holds keys unseen for more than this table's steps_to_live={ttl} steps")
        pending = len(state["pending_keys"])
        if pending and self.vocabulary.admission_threshold == 1:
            fail(f"holds {pending} pending keys, but an admission_threshold of 1 keeps none")
        pending_capacity = self.vocabulary.pending_capacity or self.capacity
        if pending > pending_capacity:
            fail(f"holds {pending} pending keys, more than the pending_capacity of "
                 f"{pending_capacity}")
        for kind in self.kinds:
            value = state.get(value_part(kind))
            expected = (count, widths[kind])
            if value is None or tuple(np.shape(value)) != expected:
                fail(f"has {kind} of shape {None if value is None else list(np.shape(value))}, "
                     f"expected {list(expected)}")

    def import_logical_state(self, state):
        """Replaces the map's state (key i of the logical order gets a row of its own) and
        returns {kind: values ordered by row} for rows [0, n), to be written to the table."""
        if self.key_dtype == tf.string:
            map_state = StringKeyRowMapState(
                state["last_step"], state["keys"], None, None, state["last_seen"],
                state["pending_keys"], state["pending_counts"], state["pending_last_seen"])
        else:
            map_state = KeyRowMapState(
                state["last_step"], state["keys"], None, state["last_seen"],
                state["pending_keys"], state["pending_counts"], state["pending_last_seen"])
        self.map.import_state(map_state)
        rows = self.export_state().rows.astype(np.int64)   # the same key order as the state
        by_row = {}
        for kind in self.kinds:
            value = np.asarray(state[value_part(kind)], np.float32)
            ordered = np.empty_like(value)
            ordered[rows] = value
            by_row[kind] = ordered
        return by_row


def value_part(kind):
    """The logical state's part holding a table's values ("values") or one slot."""
    return "values" if kind == PARAMETERS else f"slot_{kind}"


class DynamicTables:
    """Every dynamic table of one embedding (see the module docstring)."""

    def __init__(self, vocabularies, table_configs, optimizers, tables):
        """vocabularies: {table name: DynamicVocabulary}; table_configs: {name: TableConfig};
        optimizers: {name: FusedOptimizer}; tables: the embedding's LogicalTables."""
        self._logical = tables
        self.tables = {name: DynamicTable(name, table_configs[name], vocabulary,
                                          optimizers[name])
                       for name, vocabulary in sorted(vocabularies.items())}

    @property
    def names(self):
        return tuple(self.tables)

    def table(self, name):
        try:
            return self.tables[name]
        except KeyError:
            raise ValueError(f"'{name}' is not a dynamic table; the dynamic tables are "
                             f"{sorted(self.tables)}") from None

    def counter(self, name):
        """The sum over the dynamic tables of one counter (COUNTERS)."""
        index = COUNTERS.index(name)
        return sum(int(t.counters[index].numpy()) for t in self.tables.values())

    def _read(self, name):
        def read(kind):
            if self._logical.built:
                return self._logical.read(name, kind)
            return self._logical.saved_value(name, kind)
        return read

    def _widths(self, name):
        return {kind: self._logical.shape(name, kind)[1] for kind in self.table(name).kinds}

    def export(self, name):
        """(keys, values) of a table: numpy, keys ascending ([n]; bytes for string keys) and
        their rows ([n, dim])."""
        state = self.logical_state(name)
        return state["keys"], state["values"]

    def logical_state(self, name):
        """{part: numpy} of one table (eagerly: the state is read from the map)."""
        if not tf.executing_eagerly():
            raise NotImplementedError(
                f"table '{name}': the logical state of a dynamic table is read eagerly; save "
                "checkpoints with dynamic tables outside tf.function")
        return self.table(name).logical_state(self._read(name), self._widths(name))

    def check(self, name, state, source="the checkpoint"):
        """check_logical_state of one table (restore calls it; call it for every table of a
        source first, so that a bad table leaves every table as it was)."""
        self.table(name).check_logical_state(state, self._widths(name), source)

    def restore(self, name, state, source="the checkpoint"):
        """Restores one table's logical state (now, or at build() for its rows)."""
        table = self.table(name)
        self.check(name, state, source)
        with tf.init_scope():
            by_row = table.import_logical_state(state)
        self._logical.restore({name: by_row})


class DynamicTableNode(private_tf.Trackable):
    """Checkpoint node of one dynamic table: its logical state, by key, on no topology."""

    def __init__(self, tables, name):
        self._tables_ref = weakref.ref(tables)
        self.table_name = name

    def _serialize_to_tensors(self):
        state = self._tables_ref().logical_state(self.table_name)
        with tf.init_scope(), tf.device("CPU:0"):
            return {key: tf.constant(value) for key, value in state.items()}

    def _restore_from_tensors(self, restored_tensors):
        state = {key: value.numpy() for key, value in restored_tensors.items()}
        self._tables_ref().restore(self.table_name, state)
        return tf.no_op()
