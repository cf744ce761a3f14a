"""`DeltaStream`: an embedding's delta exports and their application (docs/deltas.md).

The stream keeps the *position* of the tables' state in a chain of deltas
(delta_format.position): a build starts a run at "<run>:0"; each export moves it to the delta
written; a checkpoint records it and a restore returns to it; applying a delta moves to that
delta. A delta names the position it applies to (`previous`), so applying checks one equality,
and the reasons a delta does not follow are told apart only for the message. After a restore or
an applied delta, exports continue in a new run whose first delta applies to that position, so
two runs that continue one checkpoint never write the same (run, sequence).

Export reads, between steps, what changed (tracking.py) and the values of those rows from the
rows this process stores, then writes this worker's part (delta_format.write_part), in the
background if asked. Apply reads and checks every part of a delta first, then writes: fixed
tables row by row into the rows this process stores, open vocabularies by merging the delta
into their logical state and restoring it (the restore path puts every key on its owner in any
topology), and the update step.
"""
import concurrent.futures
import os

import numpy as np
import tensorflow as tf

from tf_sc_embedding.deltas import delta_format as fmt
from tf_sc_embedding.deltas import tracking
from tf_sc_embedding.tables.dynamic_tables import value_part
from tf_sc_embedding.tables.table_storage import PARAMETERS

_STATE = ("last_seen", "pending_keys", "pending_counts", "pending_last_seen")


class DeltaStream:
    """The delta position, tracking, export and application of one embedding."""

    def __init__(self, tables, dynamic, group):
        """tables: the embedding's LogicalTables; dynamic: its DynamicTables; group: its
        ReplicaGroup."""
        self._tables = tables
        self._dynamic = dynamic
        self._group = group
        self._touched = None
        self._storage = None
        self._keys = tracking.KeyChanges(dynamic)
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "sce_delta_writer")
        self._start_run(fmt.position(fmt.new_run(), 0), None)

    def _start_run(self, state_position, base):
        self.position = state_position          # the position of the tables' state
        self._run, self._sequence = fmt.new_run(), 0
        self._base = base                       # where this run's deltas start from
        if base is None:                        # a fresh build: the run starts at its own :0
            self._run, _ = fmt.parse_position(state_position, "position")

    # ----------------------------------------------------------------- lifecycle
    def attach(self, plan, storage):
        """Creates the touched-row flags of the built tables (TableStorage `storage`); returns
        the TouchedRows the training step marks."""
        self._storage = storage
        self._touched = tracking.TouchedRows(plan, self._group)
        self._keys.reset()
        return self._touched

    def restored(self, saved_position):
        """A checkpoint was restored: its position, or None for one saved without tracking."""
        self._start_run(saved_position or fmt.position(fmt.new_run(), 0), saved_position or None)
        if self._touched is not None:
            self._touched.clear()

    def serving_info(self):
        """(position, parts, {table: rows, dim, dtype, key_dtype}) a serving model keeps to
        apply the deltas written after it (saving/serving_deltas.py)."""
        self.note_base()
        tables = {name: {k: v for k, v in self._describe(name, 0).items()
                         if k in ("stored_rows", "dim", "dtype", "key_dtype")}
                  for name in self._tables.names}
        return self.position, self._group.num_workers, tables

    def note_base(self):
        """A checkpoint or serving export of the current state is being taken."""
        if self._touched is not None:
            self._keys.note_base()

    # ----------------------------------------------------------------- export
    def export(self, directory, include_optimizer_state, step, blocking=True):
        """Writes this worker's part of the next delta under `directory`; returns its path (or
        a Future of it when not blocking)."""
        if self._touched is None:
            raise RuntimeError("export_delta needs the tables: build them first")
        with tf.init_scope():
            if self._sequence == 0 and self._group.is_multi_worker:
                self._agree_on_the_run()
            manifest, arrays = self._collect(bool(include_optimizer_state), int(step))
        self._sequence += 1
        previous = self.position
        self.position = fmt.position(self._run, self._sequence)
        manifest.update(run=self._run, sequence=self._sequence, previous=previous,
                        position=self.position, base=self._base, step=int(step),
                        optimizer_state=bool(include_optimizer_state), created=fmt.now())
        worker, workers = self._group.worker_index, self._group.num_workers
        run, sequence = self._run, self._sequence
        write = lambda: fmt.write_part(os.fspath(directory), run, sequence, worker,  # noqa
                                       workers, manifest, arrays, _farmhash64)
        future = self._writer.submit(write)
        return future.result() if blocking else future

    def _agree_on_the_run(self):
        """Every worker started the run with its own id; the parts of one delta need one: all
        take the chief's (a collective, in the first export of a run, which every worker makes).
        After a fresh build the chief's checkpoints name its own id, so those apply too."""
        proposal = np.frombuffer(bytes.fromhex(self._run), np.int32)
        chosen = self._group.gather_local_arrays(
            {r: proposal for r in self._group.local_replica_ids})[0]
        run = np.asarray(chosen, np.int32).tobytes().hex()
        if self._base is None:
            self.position = fmt.position(run, 0)
        self._run = run

    def _collect(self, with_state, step):
        touched = self._touched.take()
        stored = {}
        for (stacked, replica), rows in touched.items():
            for name, ids in self._storage.logical_rows_at(stacked, replica, rows).items():
                if self._storage.is_replicated(name) and self._group.worker_index != 0:
                    continue   # a replicated table is sent once, by the worker of replica 0
                stored[name] = np.union1d(stored.get(name, ids), ids)
        tables, arrays = {}, {}
        for name in self._tables.names:
            ids = stored.get(name, np.zeros(0, np.int64))
            entry = self._describe(name, len(ids))
            arrays[f"{name}.ids.npy"] = fmt.encode_ids(ids)
            for kind in self._kinds(name, with_state):
                values = self._storage.read_rows(name, kind, ids)
                if kind == PARAMETERS:
                    values = _stored(values, entry["dtype"])
                arrays[f"{name}.{value_part(kind)}.npy"] = values
            if entry["kind"] == "dynamic":
                self._collect_keys(name, entry, arrays, with_state)
            tables[name] = entry
        return {"format": fmt.FORMAT, "version": fmt.VERSION, "part": self._group.worker_index,
                "parts": self._group.num_workers, "tables": tables}, arrays

    def _kinds(self, name, with_state):
        return self._tables.kinds(name) if with_state else (PARAMETERS,)

    def _describe(self, name, count):
        config = self._tables.config(name)
        placement = self._storage.placement(name)
        # rows: the logical table's (a dynamic table's capacity); stored_rows: the range of the
        # ids sent (a dynamic table's rows as laid out on this topology).
        dynamic = name in self._dynamic.names
        entry = {"kind": "dynamic" if dynamic else "fixed",
                 "rows": (self._dynamic.table(name).capacity if dynamic
                          else int(config.vocabulary_size)),
                 "stored_rows": int(self._tables.shape(name)[0]), "dim": int(config.dim),
                 "dtype": placement.dtype, "optimizer": placement.optimizer.definition_name,
                 "count": int(count),
                 "slots": {kind: int(self._tables.shape(name, kind)[1])
                           for kind in self._tables.kinds(name) if kind != PARAMETERS}}
        if entry["kind"] == "dynamic":
            entry["key_dtype"] = ("string" if self._dynamic.table(name).key_dtype == tf.string
                                  else "int64")
        return entry

    def _collect_keys(self, name, entry, arrays, with_state):
        table = self._dynamic.table(name)
        touched, removed, states = self._keys.take(name)
        keys, rows, seen = [], [], []
        for replica, state in sorted(states.items()):
            chosen = touched[replica]
            keys.append(np.asarray(state.keys)[chosen])
            rows.append(np.asarray(table.shards.table_rows(np.asarray(state.rows)[chosen]),
                                   np.int64))
            seen.append(np.asarray(state.last_seen)[chosen])
        keys, rows, seen = (np.concatenate(keys), np.concatenate(rows), np.concatenate(seen))
        _put_keys(arrays, f"{name}.keys", keys, entry["key_dtype"])
        _put_keys(arrays, f"{name}.tombstones", removed, entry["key_dtype"])
        arrays[f"{name}.key_rows.npy"] = rows
        entry.update(keys=len(keys), tombstones=len(removed))
        if with_state:
            arrays[f"{name}.last_seen.npy"] = seen.astype(np.int64)
            merged = [s for _, s in sorted(states.items())]
            pending = ("pending_fingerprints" if entry["key_dtype"] == "string"
                       else "pending_keys")
            arrays[f"{name}.pending_keys.npy"] = np.concatenate(
                [np.asarray(getattr(s, pending), np.int64) for s in merged])
            for field in ("pending_counts", "pending_last_seen"):
                arrays[f"{name}.{field}.npy"] = np.concatenate(
                    [np.asarray(getattr(s, field), np.int64) for s in merged])
            entry.update(pending=len(arrays[f"{name}.pending_keys.npy"]),
                         last_step=max(int(s.last_step) for s in merged))

    # ----------------------------------------------------------------- apply
    def apply(self, path, set_update_step):
        """Applies the delta at `path` (a delta directory) to the tables; nothing is written
        unless every part passes every check. set_update_step(value) restores the step."""
        path = os.fspath(path)
        parts = fmt.read_delta(path)
        first = parts[0].manifest
        self._check_follows(path, first)
        if not first["optimizer_state"]:
            raise fmt.DeltaError(f"{path}: carries no optimizer state (exported with "
                                 "include_optimizer_state=False): it can update a serving model "
                                 "but not restore training")
        self._check_tables(path, first)
        with tf.init_scope():
            fixed, dynamic = self._read_all(parts)
            for name, state in dynamic.items():
                self._dynamic.check(name, state, source=path)
            for name, kinds in fixed.items():
                ids = kinds.pop("ids")
                for kind, values in kinds.items():
                    self._storage.write_rows(name, kind, ids, values)
            for name, state in dynamic.items():
                self._dynamic.restore(name, state, source=path)
            set_update_step(first["step"])
        self._start_run(first["position"], first["position"])
        self._touched.clear()
        self._keys.reset()
        return first["position"]

    def _check_follows(self, path, m):
        run, sequence = fmt.parse_position(self.position, "the tables' position")
        if m["previous"] == self.position:
            return
        if m["run"] == run and m["sequence"] <= sequence:
            problem = f"is delta {m['sequence']} of run {run}, already applied (the tables are "
            problem += f"at delta {sequence})"
        elif m["run"] == run:
            problem = (f"is delta {m['sequence']} of run {run}: delta(s) {sequence + 1}.."
                       f"{m['sequence'] - 1} are missing")
        elif m["previous"].split(":")[0] == m["run"]:
            problem = (f"is delta {m['sequence']} of run {m['run']}, which the tables are not "
                       f"on (they are at {self.position}): its earlier deltas are missing, or "
                       "it is stale (from an older run)")
        else:
            problem = (f"starts run {m['run']} from base checkpoint position {m['previous']}, "
                       f"another base than the tables' ({self.position})")
        raise fmt.DeltaError(f"{path}: {problem}; nothing was applied")

    def _check_tables(self, path, m):
        expected = {name: self._describe(name, 0) for name in self._tables.names}
        got = m["tables"]
        for name in sorted(set(expected) | set(got)):
            if name not in got or name not in expected:
                raise fmt.DeltaError(f"{path}: table '{name}' is only in "
                                     f"{'the embedding' if name in expected else 'the delta'}")
            keys = ("kind", "rows", "dim", "dtype", "optimizer", "slots", "key_dtype")
            mine = {k: expected[name].get(k) for k in keys}
            theirs = {k: got[name].get(k) for k in keys}
            if mine != theirs:
                raise fmt.DeltaError(f"{path}: table '{name}' is {theirs} in the delta but "
                                     f"{mine} here")

    def _read_all(self, parts):
        """({fixed table: {"ids": rows, kind: values}}, {dynamic table: merged logical state})
        of every part, all checked."""
        fixed, dynamic = {}, {}
        for name in self._tables.names:
            kinds = self._tables.kinds(name)
            ids, values = [], {kind: [] for kind in kinds}
            for part in parts:
                t = part.manifest["tables"][name]
                where = os.path.join(part.path, f"{name}.ids.npy")
                part_ids = fmt.decode_ids(part.array(f"{name}.ids.npy", np.uint8, (-1,)),
                                          t["count"], where)
                if len(part_ids) and part_ids[-1] >= t["stored_rows"]:
                    raise fmt.DeltaError(f"{where}: row {part_ids[-1]} is past the table's "
                                         f"{t['stored_rows']} rows")
                ids.append(part_ids)
                values[PARAMETERS].append(fmt.row_values(part, name, t, t["count"]))
                for kind in kinds[1:]:
                    values[kind].append(part.array(f"{name}.{value_part(kind)}.npy", np.float32,
                                                   (t["count"], t["slots"][kind])))
            ids = np.concatenate(ids)
            if len(np.unique(ids)) != len(ids):
                raise fmt.DeltaError(f"{parts[0].path}: table '{name}': parts repeat rows")
            joined = {kind: np.concatenate(v) for kind, v in values.items()}
            if name in self._dynamic.names:
                dynamic[name] = self._merged_state(name, parts, ids, joined)
            else:
                fixed[name] = dict(joined, ids=ids)
        return fixed, dynamic

    def _merged_state(self, name, parts, row_ids, rows_by_kind):
        """The logical state of a dynamic table with a delta applied (checked by the caller
        through DynamicTables.check before anything is written)."""
        strings = self._dynamic.table(name).key_dtype == tf.string
        keys, key_rows, seen, removed, pending = [], [], [], [], {f: [] for f in _STATE[1:]}
        last_step = -1
        for part in parts:
            t = part.manifest["tables"][name]
            keys.append(_get_keys(part, f"{name}.keys", t["keys"], strings))
            removed.append(_get_keys(part, f"{name}.tombstones", t["tombstones"], strings))
            key_rows.append(part.array(f"{name}.key_rows.npy", np.int64, (t["keys"],)))
            seen.append(part.array(f"{name}.last_seen.npy", np.int64, (t["keys"],)))
            for field in _STATE[1:]:
                pending[field].append(part.array(f"{name}.{field}.npy", np.int64, (t["pending"],)))
            last_step = max(last_step, t["last_step"])
        keys, key_rows, seen = np.concatenate(keys), np.concatenate(key_rows), np.concatenate(seen)
        order = np.argsort(row_ids)
        at = np.minimum(np.searchsorted(row_ids[order], key_rows), max(len(order) - 1, 0))
        if len(keys) and (not len(row_ids) or np.any(row_ids[order][at] != key_rows)):
            raise fmt.DeltaError(f"{parts[0].path}: table '{name}': a key's row is in no part")
        position = order[at] if len(keys) else np.zeros(0, np.int64)
        state = self._dynamic.logical_state(name)
        current = np.asarray(state["keys"])
        drop = np.isin(current, np.concatenate(removed + [keys]))
        merged = {"keys": np.concatenate([current[~drop], keys]),
                  "last_seen": np.concatenate([np.asarray(state["last_seen"])[~drop], seen])}
        for kind, values in rows_by_kind.items():
            merged[value_part(kind)] = np.concatenate(
                [np.asarray(state[value_part(kind)])[~drop], values[position]])
        order = np.argsort(merged["keys"], kind="stable")
        result = {k: v[order] for k, v in merged.items()}
        pending = {f: np.concatenate(v) for f, v in pending.items()}
        by_key = np.argsort(pending["pending_keys"], kind="stable")
        result.update({f: v[by_key] for f, v in pending.items()})
        result["last_step"] = np.asarray(last_step, np.int64)
        if strings:
            result["keys"] = result["keys"].astype(object)
        return result


def _stored(values, dtype):
    """Rows read (as float32) from a table of storage dtype `dtype`, back in that dtype: exact,
    since they were read from it (bfloat16 as its uint16 bits)."""
    values = np.asarray(values, np.float32)
    if dtype == "bfloat16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(fmt.ROW_DTYPES[dtype])


def _put_keys(arrays, stem, keys, key_dtype):
    if key_dtype == "string":
        data, offsets = fmt.encode_strings(keys)
        arrays[f"{stem}.npy"], arrays[f"{stem}_offsets.npy"] = data, offsets
    else:
        arrays[f"{stem}.npy"] = np.asarray(keys, np.int64)


def _get_keys(part, stem, count, strings):
    if strings:
        data = part.array(f"{stem}.npy", np.uint8, (-1,))
        offsets = part.array(f"{stem}_offsets.npy", np.int64, (count + 1,))
        return fmt.decode_strings(data, offsets, count, os.path.join(part.path, f"{stem}.npy"))
    return part.array(f"{stem}.npy", np.int64, (count,))


def _farmhash64(data):
    """TensorFlow's fingerprint of a file's bytes (what the serving model checks)."""
    with tf.device("CPU:0"):
        value = tf.fingerprint(tf.constant([data]))[0].numpy()
    return value.tobytes().hex()
