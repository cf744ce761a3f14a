"""The key-to-row map of one shard of an open-vocabulary table (docs/dynamic_vocabulary.md), as a
TensorFlow resource.

An open vocabulary's ids are arbitrary int64 keys. The map answers each occurrence of a key with a
row of the shard's table, or with -1 while the key holds no row (below its admission threshold,
refused at capacity). It decides admissions, takes rows back from keys unseen for `steps_to_live`
steps, and exports / imports its logical state, which depends on no topology. The rules live in
the C++ core (cc/core/key_row_map.h); this module only wraps the ops.
"""
import collections
import itertools

import tensorflow as tf

from tf_sc_embedding._library import library as _lib

# What one step did: rows [n] int32 (-1: no row); new_keys [k] int64 and new_rows [k] int32, the
# keys given a row in this step, whose table rows and slots must be (re)initialized before they
# are read; stats [5] int64 in the order of STEP_STATS.
MappedKeys = collections.namedtuple("MappedKeys", ["rows", "new_keys", "new_rows", "stats"])
STEP_STATS = ("admitted_keys", "evicted_keys", "refused_keys", "unadmitted_ids", "untracked_ids")

# The logical state: keys holding rows (ascending) with their rows and last-seen steps, pending
# keys (ascending) with their counts and last-seen steps, and the last mapped step (-1: none).
KeyRowMapState = collections.namedtuple(
    "KeyRowMapState",
    ["last_step", "keys", "rows", "last_seen", "pending_keys", "pending_counts",
     "pending_last_seen"])

_map_ids = itertools.count()


class KeyRowMap(tf.saved_model.experimental.TrackableResource):
    """One shard's map, created on the device in scope when it is built (a CPU).

    Args: the table's name (for error messages), its `capacity` in rows, the
    `admission_threshold` (occurrences that earn a row), `steps_to_live` (0: rows are kept) and
    `pending_capacity` (keys counted below the threshold at once; default: the capacity). Every
    value is checked by the op, which fails with InvalidArgument naming the table.
    """

    def __init__(self, table_name, capacity, admission_threshold=1, steps_to_live=0,
                 pending_capacity=None):
        self._table_name = table_name
        self._config = dict(
            table_name=table_name, capacity=int(capacity),
            admission_threshold=int(admission_threshold), steps_to_live=int(steps_to_live),
            pending_capacity=int(capacity if pending_capacity is None else pending_capacity))
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

    def _create_resource(self):
        return _lib.sce_key_row_map(shared_name=self._shared_name, **self._config)

    def _destroy_resource(self):
        tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    def map_step(self, keys, step, name=None):
        """MappedKeys of one step's keys (int64 [n], every occurrence, in batch order)."""
        rows, new_keys, new_rows, stats = _lib.sce_key_row_map_step(
            handle=self.resource_handle, keys=keys, step=tf.cast(step, tf.int64), name=name)
        return MappedKeys(rows, new_keys, new_rows, stats)

    def export(self, name=None):
        """The KeyRowMapState after the last step."""
        return KeyRowMapState(*_lib.sce_key_row_map_export(handle=self.resource_handle,
                                                           name=name))

    def import_state(self, state, name=None):
        """Replaces the state with `state` (a KeyRowMapState; `rows` is ignored): keys[i] gets
        row i. Fails naming the table, with nothing changed, when the state does not fit."""
        return _lib.sce_key_row_map_import(
            handle=self.resource_handle, last_step=tf.cast(state.last_step, tf.int64),
            keys=state.keys, last_seen=state.last_seen, pending_keys=state.pending_keys,
            pending_counts=state.pending_counts, pending_last_seen=state.pending_last_seen,
            name=name)

    def sizes(self, name=None):
        """int64 [3]: keys holding rows (including expired ones not yet swept), pending keys and
        the last mapped step."""
        return _lib.sce_key_row_map_size(handle=self.resource_handle, name=name)
