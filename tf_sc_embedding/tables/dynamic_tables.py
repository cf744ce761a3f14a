"""The open-vocabulary tables of one embedding: their key-to-row maps, counters and logical state
(docs/dynamic_vocabulary.md).

`DynamicTables` is created with the embedding, before any variable exists, so a restore before
`build()` can import a map's state at once. It owns, per dynamic table (`DynamicTable`):

* the key-to-row maps (ops.key_row_map.KeyRowMap), one per replica of this process, each
  holding the keys of its owner shard, first in its replica's share of the rows and then in
  rows the other maps lend it (dynamic_shards.ShardRows), and the counters of what they refused;
* a replica's key mapping in a step (`map_keys`, `find_keys`; over several replicas
  `begin_map`, `lend_rows`, `finish_map`) and the rows that must be reset before the lookup
  reads them (`rows_to_write`, `reset_values`), used by exchanges/dynamic.py;
* the logical state (sorted keys with their rows, slots, last-seen steps and the pending
  admission counts) that `export_dynamic_table` returns and checkpoints save (`DynamicTableNode`):
  the maps' states merged (gathered from every worker first, with several worker processes),
  and split by owner on restore.

The table's rows are the variables of `TableStorage`, read and written through `LogicalTables`;
physical rows never leave this module: the logical state is ordered by key.
"""
import collections
import weakref

import numpy as np
import tensorflow as tf

from tf_sc_embedding.tables import dynamic_vocabulary
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding import private_tf
from tf_sc_embedding.tables.dynamic_shards import ShardRows
from tf_sc_embedding.ops.key_row_map import (STRING_STEP_STATS, KeyRowMap, KeyRowMapState,
                                              RowsToReset, StringKeyRowMapState, decode_state,
                                              encode_state, key_hashes, key_owner_shards)
from tf_sc_embedding.tables.table_storage import PARAMETERS, constant_initializer_value

# Counters kept per table, summed over the steps (STRING_STEP_STATS's order; int64 keys have no
# collisions, their last counter stays 0).
COUNTERS = STRING_STEP_STATS
# The checkpoint tensors of a table's logical state besides its values and slots.
_STATE_KEYS = ("last_step", "keys", "last_seen", "pending_keys", "pending_counts",
               "pending_last_seen")
# A step's keys as positions among its distinct rows (DynamicTable.map_keys, numbered): int32
# [n] position of each occurrence's row in unique_rows, int32 [u] the distinct table rows.
NumberedRows = collections.namedtuple("NumberedRows", ["positions", "unique_rows"])
# The first part of a step's mapping over several replicas (DynamicTable.begin_map): the map's
# partial rows (for finish_map), int64 [3] counts (keys waiting for a row, rows the map can lend,
# rows to reset that another replica stores), and this part's stats.
BegunMap = collections.namedtuple("BegunMap", ["rows", "counts", "stats"])
# The largest step a map takes (cc/core/key_row_map.h, kMaxKeyRowMapStep).
_MAX_STEP = 2**31 - 1


class DynamicTable:
    """One open-vocabulary table: its maps (one per replica of this process), counters and the
    rules of its rows."""

    def __init__(self, name, table_config, vocabulary, optimizer, shards, replicas):
        """table_config: the user's TableConfig (vocabulary_size = rows held); optimizer: its
        optimizers.FusedOptimizer; shards: its dynamic_shards.ShardRows; replicas: the ids of the
        replicas that run in this process (each gets the map of its own shard)."""
        self.name = name
        self.vocabulary = vocabulary
        self.capacity = int(table_config.vocabulary_size)
        self.dim = int(table_config.dim)
        self.shards = shards
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
        self.maps = {replica: KeyRowMap(name, **self._map_arguments(replica))
                     for replica in replicas}
        # One variable that every replica of the process adds to (a plain one: under a strategy
        # scope tf.Variable would give each replica a copy of its own).
        with tf.init_scope(), tf.device("CPU:0"):
            self.counters = private_tf.plain_variable(tf.zeros([len(COUNTERS)], tf.int64),
                                                      f"{name}_dynamic_counters")

    def _map_arguments(self, replica):
        arguments = self.vocabulary.map_arguments(
            self.shards.capacity(replica),
            self.shards.pending_capacity(replica, self.vocabulary.pending_capacity))
        arguments.update(self.shards.map_arguments(replica))
        return arguments

    @property
    def key_dtype(self):
        return self.vocabulary.key_dtype

    @property
    def map(self):
        """The map of a one-replica table (several replicas: `maps`)."""
        if len(self.maps) != 1:
            raise ValueError(f"table '{self.name}' has one map per replica: use maps[replica]")
        return next(iter(self.maps.values()))

    # ----------------------------------------------------------------- a step
    def last_step(self, replica):
        """int64: the last step a replica's map mapped (-1 before the first)."""
        return self.maps[replica].sizes()[2]

    def map_keys(self, replica, keys, step=None, numbered=False):
        """(rows int32 [n], RowsToReset in table rows, step int64) of the keys a replica's map
        maps in one step ([n], every occurrence the shard owns, in batch order): an occurrence
        without a row reads the replica's scratch row. The rows to reset are this step's new
        rows, after any of an earlier step whose writes never ran (confirm_reset confirms them
        once written). step: the step to map (None: one past the map's last).

        numbered: rows is NumberedRows instead: the step's distinct table rows in order of
        first occurrence (the scratch row once, for every occurrence without a row) and each
        occurrence's position among them (KeyRowMap.number_rows)."""
        key_map = self.maps[replica]
        if step is None:
            step = key_map.sizes()[2] + 1
        mapped = key_map.map_step(keys, step)
        counted = self._count(mapped.stats)
        rows = mapped.rows
        if numbered:
            positions, rows = key_map.number_rows(rows)
        with tf.control_dependencies([counted]):
            rows = self._table_rows(replica, rows)
        if numbered:
            rows = NumberedRows(positions, rows)
        with tf.control_dependencies([mapped.rows]):
            to_reset = key_map.rows_to_reset()
        return rows, self._in_table_rows(replica, to_reset), step

    def _count(self, stats):
        if stats.shape[0] != len(COUNTERS):
            stats = tf.pad(stats, [[0, len(COUNTERS) - int(stats.shape[0])]])
        return self.counters.assign_add(stats)

    def begin_map(self, replica, keys, step):
        """With several replicas, the first part of a step's mapping (map_keys' keys and step):
        a BegunMap. Keys that find every row of the map taken wait for `finish_map`, which gets
        the rows other maps lend (exchanges/dynamic.py;
        docs/dynamic_vocabulary.md#capacity-over-several-replicas). Its stats are counted with
        finish_map's (`count`)."""
        key_map = self.maps[replica]
        mapped = key_map.map_step(keys, step, wait=True)
        with tf.control_dependencies([mapped.rows]):
            lendable = key_map.lendable()
        with tf.control_dependencies([lendable]):
            listed = key_map.rows_to_reset().rows
        stored, _ = self.shards.share_of_tensor(listed)
        elsewhere = tf.reduce_sum(tf.cast(tf.not_equal(stored, replica), tf.int64))
        return BegunMap(mapped.rows, tf.concat([lendable, elsewhere[None]], axis=0),
                        mapped.stats)

    def lend_rows(self, replica, count):
        """int32 [count]: rows of the whole table that replica `replica`'s map gives up for
        other maps' waiting keys (after begin_map, before their finish_map)."""
        return self.maps[replica].lend_rows(count)

    def finish_map(self, replica, lent, keys, begun, after=()):
        """(rows int32 [n] in table rows, RowsToReset as rows of the whole table, the step's
        stats) that end begin_map's step (`begun`), given the rows other maps lent this one
        (`lent`); after: ops that must run first (this map's own lending). The caller adds the
        stats to the counters (`count`), outside any branch that holds collectives."""
        key_map = self.maps[replica]
        with tf.control_dependencies(list(after)):
            mapped = key_map.finish_step(lent, keys, begun.rows)
        rows = self._table_rows(replica, mapped.rows)
        with tf.control_dependencies([mapped.rows]):
            to_reset = key_map.rows_to_reset()
        return rows, to_reset, begun.stats + mapped.stats

    def count(self, stats):
        """Adds a step's stats to the table's counters (one variable for every replica of the
        process: each replica updates it once per step, after its collectives, or one replica's
        update would wait for another's step)."""
        return self._count(stats)

    def confirm_reset(self, replica, to_reset, writes):
        """Confirms `to_reset` (map_keys' rows to reset) once `writes` have run."""
        with tf.control_dependencies(writes):
            return self.maps[replica].confirm_reset(tf.size(to_reset.rows))

    def find_keys(self, replica, keys):
        """(rows int32 [n], RowsToReset, step) of keys read without changing the map's keys
        (inference): a key without a row reads the scratch row. Rows an aborted training step
        left unreset are reset now."""
        key_map = self.maps[replica]
        rows = self._table_rows(replica, key_map.find(keys))
        return rows, self._in_table_rows(replica, key_map.rows_to_reset()), key_map.sizes()[2]

    def _table_rows(self, replica, rows):
        """The table rows of a map's answers (rows of the whole table); -1 (no row) reads the
        replica's scratch row."""
        return tf.where(rows < 0, tf.constant(self.shards.scratch_row(replica), tf.int32),
                        self.shards.table_rows(tf.maximum(rows, 0)))

    def _in_table_rows(self, replica, to_reset):
        del replica
        return self.in_table_rows(to_reset)

    def in_table_rows(self, to_reset):
        """RowsToReset with its rows of the whole table turned into table rows."""
        return RowsToReset(self.shards.table_rows(to_reset.rows), to_reset.keys)

    def rows_to_write(self, replica, to_reset):
        """int32 [k + 1]: the table rows written before the lookup, for every kind alike: the
        rows to reset (map_keys' or find_keys'), then the replica's scratch row."""
        return tf.concat([to_reset.rows, [self.shards.scratch_row(replica)]], axis=0)

    def reset_values(self, to_reset, kind, width):
        """float32 [k + 1, width], the values rows_to_write gets for one kind: each new row's
        initial values, drawn from its key (or its slot's initial value), and the scratch row's
        (zeros)."""
        count = tf.size(to_reset.rows)
        if kind == PARAMETERS:
            fresh = dynamic_vocabulary.initial_rows(self.initializer, to_reset.keys, width,
                                                    self.seed)
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
    def local_states(self):
        """{replica: the state of this process's map of that replica} (numpy, eager)."""
        local = {}
        for replica, key_map in self.maps.items():
            state = key_map.export()
            local[replica] = type(state)(*[np.asarray(t) for t in state])
        return local

    def export_state(self, gather=None):
        """(state, table rows) now (eager): the maps' states merged into one KeyRowMapState or
        StringKeyRowMapState of numpy arrays, keys and pending keys ascending, and each key's
        table row (int64). gather: with several worker processes, the group's
        gather_local_arrays (a collective every worker calls), which brings every replica's map
        state."""
        local = self.local_states()
        if gather is not None:
            template = next(iter(local.values()))
            words = gather({r: encode_state(state) for r, state in local.items()})
            local = {r: decode_state(template, w) for r, w in enumerate(words)}
        states, table_rows = [], []
        for replica, state in sorted(local.items()):
            states.append(state)
            table_rows.append(np.asarray(self.shards.table_rows(np.asarray(state.rows)),
                                         np.int64))
        if len(states) == 1:
            return states[0], table_rows[0]
        merged = {"last_step": max(int(s.last_step) for s in states)}
        pending = ("pending_fingerprints" if isinstance(states[0], StringKeyRowMapState)
                   else "pending_keys")
        key_order = np.argsort(np.concatenate([s.keys for s in states]), kind="stable")
        pending_order = np.argsort(np.concatenate([getattr(s, pending) for s in states]),
                                   kind="stable")
        for field in states[0]._fields:
            if field == "last_step":
                continue
            joined = np.concatenate([getattr(s, field) for s in states])
            merged[field] = joined[pending_order if field.startswith("pending") else key_order]
        return type(states[0])(**merged), np.concatenate(table_rows)[key_order]

    def logical_state(self, read, widths, gather=None):
        """{checkpoint name: numpy} of the table: keys ascending with their values, slots and
        last-seen steps, the pending counts and the last step. read(kind) -> the table's rows
        ([laid-out rows, w] numpy, or None when there are none yet); widths: {kind: w}; gather:
        as for export_state."""
        state, rows = self.export_state(gather)
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

    def _owners(self, state):
        """(owner shard of each key, of each pending key) of a logical state (eager)."""
        W = self.shards.num_replicas
        strings = self.key_dtype == tf.string
        keys = tf.constant(np.asarray(state["keys"], object if strings else np.int64),
                           self.key_dtype)
        pending = np.asarray(state["pending_keys"], np.int64)   # string tables: fingerprints
        return (key_owner_shards(key_hashes(keys), W).numpy(),
                key_owner_shards(pending, W).numpy())

    def check_logical_state(self, state, widths, source):
        """Fails naming the table, before anything changes, when a logical state does not fit
        this table: more keys than the capacity (or than one replica's share of it), keys this
        configuration has expired, pending counts it cannot hold, keys of another dtype, or
        values or slots of another shape. The maps' import checks the rest (order, ranges)."""
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
        self._check_map_rules(state, fail)
        W = self.shards.num_replicas
        if W > 1:
            _, pending_owners = self._owners(state)
            for replica in range(W):
                room = self.shards.pending_capacity(replica, self.vocabulary.pending_capacity)
                counted = int(np.sum(pending_owners == replica))
                if counted > room:
                    fail(f"holds {counted} pending keys owned by replica {replica}, more than "
                         f"its pending capacity of {room}")

    def _check_map_rules(self, state, fail):
        """The checks of the maps' own import (cc/core/key_row_map.cc), made on the whole state
        before any map changes: each owner's part then passes them too (a part of an ascending
        list ascends), so no map can reject its part after another imported its own, and every
        worker, which reads the whole state, fails alike before any collective."""
        last_step = int(np.asarray(state["last_step"]))
        if not -1 <= last_step <= _MAX_STEP:
            fail(f"has last_step {last_step}, outside [-1, {_MAX_STEP}]")
        keys, last_seen = np.asarray(state["keys"]), np.asarray(state["last_seen"], np.int64)
        pending = np.asarray(state["pending_keys"], np.int64)
        counts = np.asarray(state["pending_counts"], np.int64)
        pending_seen = np.asarray(state["pending_last_seen"], np.int64)
        if len(last_seen) != len(keys) or not len(pending) == len(counts) == len(pending_seen):
            fail("has keys, counts and last-seen steps of different lengths")
        if self.key_dtype == tf.string:
            held = np.sort(key_hashes(tf.constant(keys.astype(object), tf.string)).numpy())
            if len(held) and np.any(held[1:] == held[:-1]):
                fail("holds a string key twice, or two string keys with the same fingerprint")
        else:
            held = keys.astype(np.int64)
            if len(held) and np.any(held[1:] <= held[:-1]):
                fail("holds keys that are not strictly ascending")
        if len(pending) and np.any(pending[1:] <= pending[:-1]):
            fail("holds pending keys that are not strictly ascending")
        if np.any(counts < 1):
            fail("holds a pending count below 1")
        for name, seen in (("last-seen", last_seen), ("pending last-seen", pending_seen)):
            if np.any((seen < 0) | (seen > last_step)):
                fail(f"holds a {name} step outside [0, last_step={last_step}]")
        if len(pending) and len(held) and np.any(np.isin(pending, held)):
            fail("holds a key both with a row and pending")

    def import_logical_state(self, state, gather=None):
        """Replaces the maps' state (each key goes to its owner's map, which gives it a row) and
        returns {kind: values by table row} for rows [0, last row held], to be written to the
        table. check_logical_state has checked every rule the maps' import checks."""
        several = self.shards.num_replicas > 1
        owners, pending_owners = (self._owners(state) if several else
                                  (np.zeros(len(state["keys"]), np.int32),
                                   np.zeros(len(state["pending_keys"]), np.int32)))
        # Several replicas: keys beyond their owner's share of the rows hold rows the other
        # owners leave free (ShardRows.placement), so any state of at most `capacity` keys fits.
        placement = self.shards.placement(owners) if several else {}
        for replica, key_map in sorted(self.maps.items()):
            mine, pending = owners == replica, pending_owners == replica
            part = {name: np.asarray(value)[pending if name.startswith("pending") else mine]
                    for name, value in state.items()
                    if name in ("keys", "last_seen", "pending_keys", "pending_counts",
                                "pending_last_seen")}
            part["last_step"] = state["last_step"]
            key_map.import_state(self._map_state(part), placement.get(replica))
        merged, rows = self.export_state(gather)   # the same key order as the state
        height = int(rows.max()) + 1 if len(rows) else 0
        by_row = {}
        for kind in self.kinds:
            value = np.asarray(state[value_part(kind)], np.float32)
            ordered = np.zeros((height,) + value.shape[1:], np.float32)
            ordered[rows] = value
            by_row[kind] = ordered
        return by_row

    def _map_state(self, part):
        if self.key_dtype == tf.string:
            return StringKeyRowMapState(
                part["last_step"], part["keys"], None, None, part["last_seen"],
                part["pending_keys"], part["pending_counts"], part["pending_last_seen"])
        return KeyRowMapState(
            part["last_step"], part["keys"], None, part["last_seen"],
            part["pending_keys"], part["pending_counts"], part["pending_last_seen"])


def value_part(kind):
    """The logical state's part holding a table's values ("values") or one slot."""
    return "values" if kind == PARAMETERS else f"slot_{kind}"


class DynamicTables:
    """Every dynamic table of one embedding (see the module docstring)."""

    def __init__(self, vocabularies, table_configs, placements, tables, num_replicas,
                 replicas, gather=None):
        """vocabularies: {table name: DynamicVocabulary}; table_configs: {name: TableConfig};
        placements: {name: layout.TablePlacement} of the laid-out tables (their optimizers and
        shard rotations); tables: the embedding's LogicalTables; num_replicas: all replicas;
        replicas: the ids of those that run in this process; gather: with several worker
        processes, collectives.ReplicaGroup.gather_local_arrays (reading the state of a table
        or a counter is then a collective every worker calls)."""
        self._logical = tables
        self._replicas = tuple(replicas)
        self._gather = gather
        self._staged = {}   # {name: (restore id, logical state)} checked, not yet imported
        # Callables (table name) run after a table's state was replaced (delta tracking).
        self.import_listeners = []
        self.tables = {}
        for name, vocabulary in sorted(vocabularies.items()):
            layout = placements[name].layout
            shards = ShardRows(name, table_configs[name].vocabulary_size, num_replicas,
                               layout.num_sparse_cores // num_replicas,
                               layout.sparse_core_shard_rotation)
            self.tables[name] = DynamicTable(name, table_configs[name], vocabulary,
                                             placements[name].optimizer, shards, replicas)

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
        """{table name: one counter (COUNTERS) summed over every replica's map and every
        worker}. With several worker processes a collective: every worker must call it."""
        index = COUNTERS.index(name)
        names = sorted(self.tables)
        totals = np.array([int(self.tables[n].counters[index].numpy()) for n in names], np.int64)
        if self._gather is not None and names:
            # Each worker's counters sum its own replicas' maps: one contribution per worker.
            local = sorted(self._replicas)
            parts = self._gather({r: (totals if r == local[0] else np.zeros_like(totals))
                                  .view(np.int32) for r in local})
            totals = sum(np.asarray(p, np.int32).view(np.int64) for p in parts)
        return {n: int(t) for n, t in zip(names, totals)}

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
        return self.table(name).logical_state(self._read(name), self._widths(name),
                                              self._gather)

    def check(self, name, state, source="the checkpoint"):
        """check_logical_state of one table (restore calls it; call it for every table of a
        source first, so that a bad table leaves every table as it was)."""
        self.table(name).check_logical_state(state, self._widths(name), source)

    def restore(self, name, state, source="the checkpoint"):
        """Restores one table's logical state (now, or at build() for its rows)."""
        self.check(name, state, source)
        self._import(name, state)

    def _import(self, name, state):
        with tf.init_scope():
            by_row = self.table(name).import_logical_state(state, self._gather)
        self._logical.restore({name: by_row})
        for listener in self.import_listeners:
            listener(name)

    # A `tf.train.Checkpoint` restore hands each table's state to its node separately, so a
    # checkpoint's tables are staged (checked and held) first and imported together at the end of
    # the restore (checkpointing's registered restore function, which TensorFlow runs after every
    # node's own restore): a table that fails its checks then leaves every table as it was. Each
    # state is held with the id of its restore (private_tf.restore_uid): only the states of the
    # restore that commits are imported, and a restore that failed after staging (elsewhere,
    # before the commit) leaves nothing a later restore would import.
    def stage(self, name, state, restore_id, source="the checkpoint"):
        """Checks one table's state and holds it for commit_staged; a failing check forgets
        every staged state (that restore fails)."""
        self._staged = {n: held for n, held in self._staged.items() if held[0] == restore_id}
        try:
            self.check(name, state, source)
        except Exception:
            self._staged = {}
            raise
        self._staged[name] = (restore_id, state)

    def commit_staged(self, restore_id):
        """Imports the states staged by restore `restore_id` (all passed their checks) and
        forgets every staged state."""
        staged, self._staged = self._staged, {}
        for name, (held_by, state) in staged.items():
            if held_by == restore_id:
                self._import(name, state)

    def discard_staged(self):
        """Forgets the staged states (the restore failed before committing)."""
        self._staged = {}


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
        # Checked now, imported with the checkpoint's other tables once all passed
        # (DynamicTables.stage; checkpointing's restore function commits).
        state = {key: value.numpy() for key, value in restored_tensors.items()}
        self._tables_ref().stage(self.table_name, state, private_tf.restore_uid(self))
        return tf.no_op()
