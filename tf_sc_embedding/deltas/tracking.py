"""What changed since the previous delta: touched rows and, for open vocabularies, keys.

Fixed and open-vocabulary tables alike keep their rows in the stacked variables, and the fused
update is the only training write to them, so one uint8 flag per stored row, which the update op
itself sets for every row it writes (its `touched_flags`, cc/core/touched_rows.h), says which
rows a delta must carry. The flags live beside the tables, one variable per stacked table and local
replica, and each worker reads only its own: a delta part is the rows a worker stores.

An open vocabulary also changes which keys hold rows. Its maps know each key's last-seen step
(every training lookup of a key sets it), so the keys to send are those seen after the map's
step at the previous delta, and the keys removed (evicted or expired) are those the map held
then, or at any checkpoint or serving export since (a base a consumer may hold), and holds no
longer. Each worker compares its own maps only.
"""
import numpy as np
import tensorflow as tf

from tf_sc_embedding.tables.table_storage import zeros_variable


class TouchedRows:
    """The touched-row flags of every stacked table on this process's replicas."""

    def __init__(self, plan, group):
        self._group = group
        self._flags = {}
        with tf.init_scope():
            for name, stacked in plan.stacked_tables.items():
                rows = plan.sparse_cores_per_replica * stacked.rows_per_shard
                self._flags[name] = {
                    r: zeros_variable((rows,), f"{name}/touched/replica_{r}",
                                      group.device_of(r), tf.uint8)
                    for r in group.local_replica_ids}

    def flags(self, stacked_name, replica):
        return self._flags[stacked_name][replica]

    def take(self):
        """{(stacked name, replica): ascending touched rows of the replica's variable}, and
        clears every flag (eager, between steps)."""
        taken = {}
        for name, by_replica in self._flags.items():
            for replica, flags in by_replica.items():
                taken[(name, replica)] = np.flatnonzero(flags.numpy())
                flags.assign(tf.zeros_like(flags))
        return taken

    def clear(self):
        for by_replica in self._flags.values():
            for flags in by_replica.values():
                flags.assign(tf.zeros_like(flags))


class KeyChanges:
    """Per open-vocabulary table and local map: the map's step and keys at the previous delta."""

    def __init__(self, dynamic):
        self._dynamic = dynamic
        self._baselines = {}
        dynamic.import_listeners.append(self.reset)

    def reset(self, name=None):
        """Takes the maps' current state as the baseline (after a build, restore or delta)."""
        with tf.init_scope():
            self._reset(name)

    def _reset(self, name):
        for table_name in ([name] if name else self._dynamic.names):
            table = self._dynamic.table(table_name)
            self._baselines[table_name] = {
                replica: (int(state.last_step), np.asarray(state.keys))
                for replica, state in table.local_states().items()}

    def note_base(self):
        """A checkpoint or serving export is taken now: its keys join the baselines, so a key it
        holds that is removed before the next delta is among that delta's tombstones, even if it
        arrived after the previous delta."""
        with tf.init_scope():
            for name in self._dynamic.names:
                baseline = self._baselines.setdefault(name, {})
                for replica, state in self._dynamic.table(name).local_states().items():
                    step, keys = baseline.get(replica, (-1, np.asarray(state.keys)[:0]))
                    baseline[replica] = (step, np.union1d(keys, np.asarray(state.keys)))

    def take(self, name):
        """(touched, removed, states) of one table's local maps since the baseline, which then
        moves to now: touched {replica: indices into the state's keys seen since}, removed: the
        keys the maps held then and no longer hold (ascending), states {replica: state}."""
        table = self._dynamic.table(name)
        states = table.local_states()
        before = self._baselines.get(name, {})
        touched, removed = {}, []
        for replica, state in states.items():
            step, keys = before.get(replica, (-1, np.zeros(0, np.asarray(state.keys).dtype)))
            touched[replica] = np.flatnonzero(np.asarray(state.last_seen) > step)
            removed.append(np.setdiff1d(keys, np.asarray(state.keys)))
        self._baselines[name] = {r: (int(s.last_step), np.asarray(s.keys))
                                 for r, s in states.items()}
        removed = np.sort(np.concatenate(removed)) if removed else np.zeros(0, np.int64)
        return touched, removed, states
