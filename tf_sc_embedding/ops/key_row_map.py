"""The key-to-row map of one shard of an open-vocabulary table (docs/dynamic_vocabulary.md), as a
TensorFlow resource.

An open vocabulary's ids are arbitrary int64 or string keys. The map answers each occurrence of a
key with a row of the shard's table, or with -1 while the key holds no row (below its admission
threshold, refused at capacity). It decides admissions, takes rows back from keys unseen for `steps_to_live`
steps, and exports / imports its logical state, which depends on no topology. The rules live in
the C++ core (cc/core/key_row_map.h, cc/core/string_key_row_map.h); this module only wraps the
ops.
"""
import collections
import itertools

import numpy as np
import tensorflow as tf

from tf_sc_embedding._library import library as _lib

# What one step did: rows [n] int32 (-1: no row); new_keys [k] int64 and new_rows [k] int32, the
# keys given a row in this step, whose table rows and slots must be (re)initialized before they
# are read; stats [5] int64 in the order of STEP_STATS.
MappedKeys = collections.namedtuple("MappedKeys", ["rows", "new_keys", "new_rows", "stats"])
STEP_STATS = ("admitted_keys", "evicted_keys", "refused_keys", "unadmitted_ids", "untracked_ids")
# String keys add the occurrences refused because another string holds their fingerprint's row.
STRING_STEP_STATS = STEP_STATS + ("collided_ids",)

# The logical state: keys holding rows (ascending) with their rows and last-seen steps, pending
# keys (ascending) with their counts and last-seen steps, and the last mapped step (-1: none).
KeyRowMapState = collections.namedtuple(
    "KeyRowMapState",
    ["last_step", "keys", "rows", "last_seen", "pending_keys", "pending_counts",
     "pending_last_seen"])

# String keys: held keys ascending by bytes with their fingerprints; pending counts are kept per
# fingerprint.
StringKeyRowMapState = collections.namedtuple(
    "StringKeyRowMapState",
    ["last_step", "keys", "fingerprints", "rows", "last_seen", "pending_fingerprints",
     "pending_counts", "pending_last_seen"])

_map_ids = itertools.count()


# The rows to reset (KeyRowMap.rows_to_reset): rows int32 [k], and the key each was last given to
# (int64 [k]; a string map's fingerprint), from which its initial values are drawn.
RowsToReset = collections.namedtuple("RowsToReset", ["rows", "keys"])


def encode_state(state):
    """A map state (numpy fields) as one int32 vector, to be gathered from other workers: per field its kind (0: integers, 1:
    strings), its length and its values as int64 words; strings as their lengths, then their
    bytes padded to whole words."""
    words = []
    for value in state:
        value = np.asarray(value)
        if value.dtype == object:
            data = b"".join(bytes(v) for v in value.ravel())
            data += b"\0" * (-len(data) % 8)
            lengths = np.array([len(bytes(v)) for v in value.ravel()], np.int64)
            words += [np.array([1, value.size], np.int64), lengths,
                      np.frombuffer(data, np.int64)]
        else:
            words += [np.array([0, value.size], np.int64), value.astype(np.int64).ravel()]
    return np.concatenate(words).view(np.int32)


def decode_state(template, words):
    """The inverse of encode_state: a state of the template's type and field dtypes."""
    words = np.asarray(words, np.int32).view(np.int64)
    fields, at = [], 0
    for name, like in zip(template._fields, template):
        strings, size = int(words[at]), int(words[at + 1])
        at += 2
        if strings:
            lengths = words[at:at + size]
            at += size
            total = int(lengths.sum())
            data = words[at:at + (total + 7) // 8].tobytes()
            at += (total + 7) // 8
            ends = np.cumsum(lengths)
            fields.append(np.array([data[e - n:e] for e, n in zip(ends, lengths)], dtype=object))
        else:
            value = words[at:at + size].astype(np.asarray(like).dtype)
            at += size
            fields.append(value.reshape(np.shape(like)) if np.ndim(like) == 0 else value)
    return type(template)(*fields)


def key_fingerprints(keys):
    """int64 [n]: the 64-bit fingerprint (`tf.fingerprint`) of each string in `keys` ([n])."""
    return tf.reshape(tf.bitcast(tf.fingerprint(keys), tf.int64), [-1])


def key_hashes(keys):
    """int64 [n]: what identifies each key to the owner and value hashes: an int64 key itself,
    a string key's fingerprint (the string map keys its rows by it too)."""
    keys = tf.convert_to_tensor(keys)
    if keys.dtype == tf.string:
        return key_fingerprints(keys)
    return tf.reshape(tf.cast(keys, tf.int64), [-1])


def key_owner_shards(hashes, num_shards, name=None):
    """int32 [n]: the owner shard, in [0, num_shards), of each key hash (key_hashes): a fixed
    function of the key (docs/dynamic_vocabulary.md#several-replicas)."""
    return _lib.sce_key_owner_shards(keys=tf.convert_to_tensor(hashes, tf.int64),
                                     num_shards=int(num_shards), name=name)


# A replica's int64 keys of one table grouped for their owner shards (group_keys_by_owner): keys
# [u] the distinct keys, owner 0's first, each owner's in order of first appearance; occurrences
# [u] int32; owner_counts [num_shards] int32, the distinct keys of each owner; positions [n]
# int32, each key's index in `keys`.
KeysByOwner = collections.namedtuple("KeysByOwner",
                                     ["keys", "occurrences", "owner_counts", "positions"])


def group_keys_by_owner(keys, num_shards, table_name="", name=None):
    """KeysByOwner of int64 keys ([n]) for num_shards owner shards (key_owner_shards): the first
    step of the key exchange (exchanges/key_exchange.py), in one pass."""
    return KeysByOwner(*_lib.sce_group_keys_by_owner(
        keys=tf.convert_to_tensor(keys, tf.int64), num_shards=int(num_shards),
        table_name=table_name, name=name))


def repeat_indices(counts, table_name="", name=None):
    """int32 [sum(counts)]: the index of each key repeated counts[k] times, in order (counts
    int32 [m], >= 0): the occurrences an owner's map steps through (exchanges/key_exchange.py).
    O(sum(counts)); tf.repeat would build an [m, max(counts)] mask."""
    return _lib.sce_repeat_indices(counts=tf.convert_to_tensor(counts, tf.int32),
                                   table_name=table_name, name=name)


def keyed_random_rows(hashes, seed, width, distribution, a, b, name=None):
    """float32 [n, width]: the initial values of rows given to keys with these hashes, element
    (i, j) a function of (seed, hashes[i], j) only (cc/core/key_values.h). distribution:
    "uniform" (a = low, b = high), "normal" or "truncated_normal" (a = mean, b = stddev)."""
    return _lib.sce_keyed_random_rows(keys=tf.convert_to_tensor(hashes, tf.int64),
                                      seed=int(seed), width=int(width),
                                      distribution=distribution, a=float(a), b=float(b),
                                      name=name)


class KeyRowMap(tf.saved_model.experimental.TrackableResource):
    """One shard's map, created on the device in scope when it is built (a CPU).

    Args: the table's name (for error messages), its `capacity` in rows, the
    `admission_threshold` (occurrences that earn a row), `steps_to_live` (0: rows are kept),
    `pending_capacity` (keys counted below the threshold at once; default: the capacity),
    `key_dtype` (tf.int64 or tf.string), and with several shards `total_rows` (the rows of all
    of them) and `first_row` (this shard's first own row among them): every row the map gives
    or takes is then a row of the whole table, and shards can lend each other rows
    (`lendable`, `lend_rows`, `finish_step`). Every value is checked by the op, which fails
    with InvalidArgument naming the table.
    """

    def __init__(self, table_name, capacity, admission_threshold=1, steps_to_live=0,
                 pending_capacity=None, key_dtype=tf.int64, total_rows=0, first_row=0):
        key_dtype = tf.as_dtype(key_dtype)
        if key_dtype not in (tf.int64, tf.string):
            raise ValueError(f"table '{table_name}': key_dtype must be tf.int64 or tf.string, "
                             f"got {key_dtype.name}")
        self._key_dtype = key_dtype
        self._table_name = table_name
        self._config = dict(
            table_name=table_name, capacity=int(capacity),
            admission_threshold=int(admission_threshold), steps_to_live=int(steps_to_live),
            pending_capacity=int(capacity if pending_capacity is None else pending_capacity),
            total_rows=int(total_rows), first_row=int(first_row))
        # Each map is its own resource: a process-wide unique shared name.
        self._shared_name = f"sce_key_row_map_{table_name}_{next(_map_ids)}"
        super().__init__()
        # Created now, outside any function being traced, so a bad configuration fails here and
        # every function captures the same map.
        with tf.init_scope():
            self.resource_handle  # pylint: disable=pointless-statement

    @property
    def table_name(self):
        return self._table_name

    @property
    def config(self):
        return dict(self._config)

    @property
    def key_dtype(self):
        return self._key_dtype

    @property
    def _strings(self):
        return self._key_dtype == tf.string

    def _create_resource(self):
        create = _lib.sce_string_key_row_map if self._strings else _lib.sce_key_row_map
        return create(shared_name=self._shared_name, **self._config)

    def _destroy_resource(self):
        # Eagerly, wherever the last reference dies: the map was created outside any traced
        # function, and a garbage collection in the middle of a trace must not add this op to
        # the graph being traced (or wait for that graph's lock).
        with tf.init_scope():
            tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    def map_step(self, keys, step, wait=False, name=None):
        """MappedKeys of one step's keys ([n] of key_dtype, every occurrence, in batch order);
        stats in the order of STEP_STATS (STRING_STEP_STATS for string keys).

        wait=True: keys that find every row taken wait, and `finish_step` ends the step with the
        rows other shards lend (until then `rows` are only for finish_step; string keys report
        their new rows there)."""
        step = tf.cast(step, tf.int64)
        if self._strings:
            keys = tf.convert_to_tensor(keys, tf.string)
            outputs = _lib.sce_string_key_row_map_step(
                handle=self.resource_handle, keys=keys, fingerprints=key_fingerprints(keys),
                step=step, wait=wait, name=name)
        else:
            outputs = _lib.sce_key_row_map_step(handle=self.resource_handle, keys=keys,
                                                step=step, wait=wait, name=name)
        return MappedKeys(*outputs)

    def lendable(self, name=None):
        """int64 [2]: after map_step(wait=True), [keys waiting for a row, rows this map can
        still give] (rows of keys expired by then taken back first)."""
        op = (_lib.sce_string_key_row_map_lendable if self._strings
              else _lib.sce_key_row_map_lendable)
        return op(handle=self.resource_handle, name=name)

    def lend_rows(self, count, name=None):
        """int32 [count]: `count` (<= lendable()[1]) of this map's free rows, given to another
        shard's map (they leave this one), in the order this map would have used them."""
        op = (_lib.sce_string_key_row_map_lend_rows if self._strings
              else _lib.sce_key_row_map_lend_rows)
        return op(handle=self.resource_handle, count=tf.cast(count, tf.int64), name=name)

    def finish_step(self, lent, keys, rows, name=None):
        """MappedKeys that end a map_step(wait=True) of the same keys, given its rows and the
        rows other maps lent this one: the waiting keys take them in order, the others are
        refused. stats and new rows are this part's (string keys: the whole step's new rows)."""
        lent = tf.cast(lent, tf.int32)
        if self._strings:
            keys = tf.convert_to_tensor(keys, tf.string)
            outputs = _lib.sce_string_key_row_map_finish_step(
                handle=self.resource_handle, lent=lent, keys=keys,
                fingerprints=key_fingerprints(keys), rows=rows, name=name)
        else:
            outputs = _lib.sce_key_row_map_finish_step(handle=self.resource_handle, lent=lent,
                                                       keys=keys, rows=rows, name=name)
        return MappedKeys(*outputs)

    def rows_to_reset(self, name=None):
        """RowsToReset: the rows given to keys and not yet confirmed reset, in admission order,
        each once, with their keys' hashes; rows of a step whose writes never ran stay listed
        (confirm_reset)."""
        op = (_lib.sce_string_key_row_map_rows_to_reset if self._strings
              else _lib.sce_key_row_map_rows_to_reset)
        return RowsToReset(*op(handle=self.resource_handle, name=name))

    def confirm_reset(self, count, name=None):
        """Removes the first `count` rows of rows_to_reset(), once they were (re)initialized."""
        op = (_lib.sce_string_key_row_map_confirm_reset if self._strings
              else _lib.sce_key_row_map_confirm_reset)
        return op(handle=self.resource_handle, count=tf.cast(count, tf.int32), name=name)

    def number_rows(self, rows, name=None):
        """(positions int32 [n], unique_rows int32 [u]) of rows the map gave in its last step
        (map_step's rows or some of them, -1 included): unique_rows holds each distinct row once
        in order of first occurrence (-1 once, if it occurs), positions[i] the index of rows[i]
        in it. A lookup's deduplication, with no sort; a row not given in the last step fails.
        The map is unchanged."""
        op = (_lib.sce_string_key_row_map_number_rows if self._strings
              else _lib.sce_key_row_map_number_rows)
        return op(handle=self.resource_handle, rows=rows, name=name)

    def find(self, keys, name=None):
        """int32 [n]: each key's row, or -1 when it holds none at the last step; read-only (no
        count, admission or eviction), for inference."""
        if self._strings:
            keys = tf.convert_to_tensor(keys, tf.string)
            return _lib.sce_string_key_row_map_find(handle=self.resource_handle, keys=keys,
                                                    fingerprints=key_fingerprints(keys),
                                                    name=name)
        return _lib.sce_key_row_map_find(handle=self.resource_handle, keys=keys, name=name)

    def export(self, name=None):
        """The state after the last step: a KeyRowMapState, or a StringKeyRowMapState."""
        if self._strings:
            return StringKeyRowMapState(*_lib.sce_string_key_row_map_export(
                handle=self.resource_handle, name=name))
        return KeyRowMapState(*_lib.sce_key_row_map_export(handle=self.resource_handle,
                                                           name=name))

    def import_state(self, state, placement=None, name=None):
        """Replaces the state with `state` (as `export` returns it; `rows` is ignored, and string
        keys are fingerprinted again). Int64 keys: keys[i] gets the map's own row i; string keys:
        the key with the i-th smallest fingerprint. placement: (rows, lent_rows), keys[i] then
        getting the table row rows[i] (the map's own or another shard's), lent_rows being the
        map's own rows other shards' keys hold. Fails naming the table, with nothing changed,
        when the state does not fit."""
        last_step = tf.cast(state.last_step, tf.int64)
        rows, lent = placement if placement is not None else ([], [])
        placed = dict(placement_rows=tf.constant(np.asarray(rows, np.int32).reshape([-1])),
                      lent_rows=tf.constant(np.asarray(lent, np.int32).reshape([-1])),
                      placed=placement is not None)
        if self._strings:
            keys = tf.convert_to_tensor(state.keys, tf.string)
            return _lib.sce_string_key_row_map_import(
                handle=self.resource_handle, last_step=last_step, keys=keys,
                fingerprints=key_fingerprints(keys), last_seen=state.last_seen,
                pending_fingerprints=state.pending_fingerprints,
                pending_counts=state.pending_counts, pending_last_seen=state.pending_last_seen,
                name=name, **placed)
        return _lib.sce_key_row_map_import(
            handle=self.resource_handle, last_step=last_step, keys=state.keys,
            last_seen=state.last_seen, pending_keys=state.pending_keys,
            pending_counts=state.pending_counts, pending_last_seen=state.pending_last_seen,
            name=name, **placed)

    def sizes(self, name=None):
        """int64 [3]: keys holding rows (including expired ones not yet swept), pending keys and
        the last mapped step."""
        size = _lib.sce_string_key_row_map_size if self._strings else _lib.sce_key_row_map_size
        return size(handle=self.resource_handle, name=name)
