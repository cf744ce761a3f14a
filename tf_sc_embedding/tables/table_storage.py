"""The one owner of table storage: per-replica variables, their placement and logical views.

Layout recap (docs/layout.md#mod-sharding): a stacked table is split into N = replicas x S
SparseCore shards of R rows each; replica d holds shards [d*S, (d+1)*S) as one [S*R, width]
variable per stacked table and per optimizer slot. Logical row r of a member table lives in shard
(r + rotation) mod N at row row_offset + r // N of that shard. A slot has the table's rows; its
width is the table's, or 1 for a row-wise slot (`FusedOptimizer.slot_width`), so every logical
view below has the kind's own width (`logical_width`).

`TableStorage` creates the variables of the replicas that run in *this process only* (under
MultiWorkerMirroredStrategy every worker holds 1/workers of every table and slot), and offers the
logical [vocabulary_size, dim] view of every user table and slot ([vocabulary_size, 1] for a
row-wise slot):

* `read_logical(table, kind)`: the complete logical table. With several worker processes this is
  a collective read (every worker must call it, in the same order; TensorFlow's checkpoint and
  Keras saving protocols do): each replica contributes the rows it holds and the rows are
  all-gathered, one table at a time.
* `write_logical_rows(table, kind, first_row, values)`: writes a block of logical rows into the
  shards of this process (rows held elsewhere are skipped), so restoring reads the checkpoint in
  bounded chunks and keeps only its own rows.
* variables are created as TensorFlow-owned zeros and filled in place, one member table at a
  time (an initializer is evaluated at the logical shape, so a seeded initializer gives the same
  logical table on any topology; one that accepts `shard_info` is evaluated in chunks of rows),
  or from a deferred restore: `PendingRestore` keeps what was restored before the tables exist.

Small tables may instead be *replicated* (layout.EmbeddingPlan): laid out as for one replica
and held whole by every replica; reading them needs no collective, writing writes every copy.

Nothing else in the library touches the variables or the logical<->storage mapping.
"""
import inspect

import numpy as np
import tensorflow as tf

from tf_sc_embedding import private_tf

PARAMETERS = "parameters"

# Logical rows handled at a time when a table is filled from a source of logical rows: an
# initializer that accepts `shard_info`, a checkpoint (which also stores tall tables in row slices
# of this size, see checkpointing.py), or another chunk reader.
LOGICAL_CHUNK_ROWS = 1 << 20


def array_reader(value):
    """A chunk reader (first, stop) -> rows over an array of logical rows (no copy)."""
    return lambda first, stop: value[first:stop]


def logical_chunks(height):
    """(first, stop) of the chunks of LOGICAL_CHUNK_ROWS rows that cover [0, height).

    Every fill of a table from logical rows goes through these chunks, and checkpoints store
    tall tables in exactly these row slices, so that each read loads one stored slice.
    """
    return [(first, min(height, first + LOGICAL_CHUNK_ROWS))
            for first in range(0, height, LOGICAL_CHUNK_ROWS)]
_ALIGN = 64            # EIGEN_MAX_ALIGN_BYTES


# --------------------------------------------------------------------------------- initializers
def _accepts_shard_info(initializer):
    try:
        return "shard_info" in inspect.signature(initializer).parameters
    except (TypeError, ValueError):
        return False


def _initial_rows(initializer, shape, what):
    """A reader (first, stop) -> rows of the initial logical values of shape [height, width].

    An initializer that accepts `shard_info` (TensorFlow's protocol for partitioned variables) is
    evaluated one chunk of rows per call, so only that chunk is held. Any other initializer is
    evaluated once at the whole logical shape: a seeded random initializer defines the values of
    that shape only, and evaluating it there gives the same logical table on every topology.
    """
    if initializer is None:
        initializer = tf.initializers.TruncatedNormal(mean=0.0, stddev=1 / np.sqrt(shape[1]))
    if _accepts_shard_info(initializer):
        def read_chunk(first, stop):
            info = private_tf.ShardInfo(shape=[stop - first, shape[1]], offset=[first, 0])
            return _checked(initializer(shape, tf.float32, shard_info=info),
                            (stop - first, shape[1]), what)
        return read_chunk
    try:
        value = initializer(shape=shape, dtype=tf.float32)
    except TypeError:
        value = initializer(shape, tf.float32)
    return array_reader(_checked(value, tuple(shape), what))


def _checked(value, shape, what):
    value = np.asarray(value, dtype=np.float32)
    if value.shape != tuple(shape):
        raise ValueError(f"{what}: the initializer returned shape {value.shape}, expected "
                         f"{list(shape)}")
    return value


def constant_initializer_value(initializer):
    """The scalar of a constant initializer (TensorFlow's slot initializers), else None."""
    try:
        config = initializer.get_config()
    except Exception:  # pylint: disable=broad-except
        return None
    value = config.get("value") if isinstance(config, dict) else None
    if value is None or np.ndim(value) != 0:
        return None
    return float(value)


# --------------------------------------------------------------------------------- buffers
def aligned_empty(shape, dtype=np.float32):
    """An uninitialized C-contiguous array whose data is 64-byte aligned (zero-copy to TF)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-buffer.ctypes.data) % _ALIGN
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def as_tensor_zero_copy(array):
    """An eager tensor sharing `array`'s memory (DLPack); falls back to a copy if impossible."""
    array = np.asarray(array)
    if array.flags.c_contiguous and array.ctypes.data % _ALIGN == 0 and array.size:
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # pylint: disable=broad-except
            pass
    return tf.convert_to_tensor(array)


def zeros_variable(shape, name, device, dtype=tf.float32):
    """A resource variable of zeros whose buffer is owned by TensorFlow alone."""
    with tf.init_scope(), tf.device(device):
        variable = private_tf.uninitialized_variable(shape=shape, dtype=dtype, name=name)
        # A freshly allocated buffer (an eager Fill, not a cached or folded constant) that the
        # variable adopts; once `zeros` is dropped the variable is its only owner.
        zeros = tf.fill(tf.constant(shape, tf.int64), tf.zeros([], dtype))
        variable.assign(zeros)
        del zeros
    return variable


class _CopyOnRead(Exception):
    pass


def _writable_views(variables):
    """Numpy views aliasing the variables' buffers (for in-place writes by this module only).

    Only valid while no TensorFlow op runs on the variables; drop the views before the next op
    (a kernel that updates in place copies a buffer that is still referenced).
    """
    views = []
    for variable in variables:
        first = private_tf.numpy_view(variable.read_value())
        second = private_tf.numpy_view(variable.read_value())
        if first.ctypes.data != second.ctypes.data:   # copy-on-read mode: reads are copies
            raise _CopyOnRead()
        views.append(first)
        del second
    return views


# --------------------------------------------------------------------------------- one table
class ShardedTable(tf.Module):
    """One stacked table (or one of its slots): the variables of this process's replicas."""

    def __init__(self, name, shards_by_replica):
        super().__init__(name=None)
        self.table_name = name
        self.shards_by_replica = dict(shards_by_replica)

    @property
    def shards(self):
        """The local replicas' variables, in replica order."""
        return [self.shards_by_replica[r] for r in sorted(self.shards_by_replica)]

    def shard(self, replica_id):
        try:
            return self.shards_by_replica[replica_id]
        except KeyError:
            raise ValueError(f"table '{self.table_name}': replica {replica_id} is not held by this "
                             f"process (it holds {sorted(self.shards_by_replica)})") from None


class _Blocks:
    """Where the logical rows of one member table sit in the replicas' variables.

    padded_height is a multiple of N, so logical rows k, k+N, k+2N, ... (one residue k) form one
    contiguous block of shard (k + rotation) mod N starting at row_offset. `blocks` lists, per k,
    (replica, first row in that replica's variable, logical rows of k below the height).
    """

    def __init__(self, placement, num_replicas, sparse_cores):
        layout = placement.layout
        self.layout = layout
        self.n = num_replicas * sparse_cores
        if layout.padded_height % self.n:
            raise AssertionError(f"table '{placement.name}': padded height {layout.padded_height} "
                                 f"is not a multiple of {self.n} SparseCores")
        self.rows_per_residue = layout.padded_height // self.n
        rows_per_shard = layout.total_rows_per_sparse_core_shard
        self.blocks = []
        for k in range(self.n):
            shard = (k + layout.sparse_core_shard_rotation) % self.n
            start = (shard % sparse_cores) * rows_per_shard + layout.sparse_core_shard_row_offset
            count = max(0, -(-(layout.height - k) // self.n))
            self.blocks.append((k, shard // sparse_cores, start, count))

    def of_replica(self, replica):
        return [b for b in self.blocks if b[1] == replica]


# --------------------------------------------------------------------------------- the owner
class PendingRestore:
    """Logical values restored before the tables exist; `TableStorage.create` consumes them.

    Holds, per table and kind, a numpy array or a chunk reader (first_row, stop) -> rows (a
    checkpoint's, so nothing is read before the tables are built). A later value wins per table
    and kind.
    """

    def __init__(self):
        self._values = {}

    def add(self, values):
        """values: {table name: {kind: array or reader}}."""
        for name, kinds in values.items():
            self._values.setdefault(name, {}).update(kinds)

    def reader(self, table_name, kind):
        """A chunk reader of what is held for a table's parameters or slot, or None."""
        value = self._values.get(table_name, {}).get(kind)
        return value if value is None or callable(value) else array_reader(value)

    def clear(self):
        self._values = {}


class TableStorage:
    """Variables of every stacked table and slot held by this process, and their logical views."""

    def __init__(self, plan, group):
        self.plan = plan
        self.group = group
        self.sparse_cores = plan.sparse_cores_per_replica
        self.num_replicas = plan.num_replicas
        self._placements = {t.name: t for s in plan.stacked_tables.values() for t in s.tables}
        self._replicated = frozenset(
            t.name for s in (plan.replicated.stacked_tables.values() if plan.replicated else ())
            for t in s.tables)
        self._blocks = {
            name: _Blocks(p, 1 if name in self._replicated else self.num_replicas,
                          self.sparse_cores)
            for name, p in self._placements.items()}
        self._tables = None

    def is_replicated(self, table_name):
        """True if every replica holds the whole table (small tables; see layout.EmbeddingPlan)."""
        return table_name in self._replicated

    def _holders(self, table_name, block_replica):
        """The local replicas whose variables hold a block (a replicated table's: all of them)."""
        if table_name in self._replicated:
            return self.group.local_replica_ids
        return (block_replica,) if block_replica in self.group.local_replica_ids else ()

    # -- queries
    def placement(self, table_name):
        try:
            return self._placements[table_name]
        except KeyError:
            raise KeyError(f"unknown table '{table_name}'") from None

    @property
    def table_names(self):
        return tuple(self._placements)

    def logical_width(self, table_name, kind):
        """Columns of a table's logical parameters (its dim) or of one of its slots."""
        placement = self.placement(table_name)
        width = placement.layout.width
        return width if kind == PARAMETERS else placement.optimizer.slot_width(kind, width)

    @staticmethod
    def stored_width(stacked, kind):
        """Columns of a stacked table's variable of `kind` (the padded width, or 1 row-wise)."""
        width = stacked.padded_width
        return width if kind == PARAMETERS else stacked.optimizer.slot_width(kind, width)

    def stacked_variables(self):
        """Stacked table name -> {"parameters": ShardedTable, <slot>: ShardedTable}."""
        return self._tables

    def local_variables(self):
        return [v for kinds in self._tables.values() for t in kinds.values() for v in t.shards]

    # -- creation
    def create(self, from_checkpoint=None):
        """Creates the variables of the local replicas, from initializers or a checkpoint.

        `from_checkpoint(table_name, kind)` returns None or a reader `(first_row, stop) -> numpy
        rows` of the checkpointed logical table (deferred restore): it is used instead of the
        initializer, reading in chunks and keeping only the rows this process holds.
        """
        tables = {}
        with tf.init_scope():
            for stacked_name, stacked in self.plan.stacked_tables.items():
                kinds = {}
                for kind in (PARAMETERS,) + tuple(stacked.optimizer.slot_names):
                    kinds[kind] = self._create_one(stacked, kind, from_checkpoint)
                tables[stacked_name] = kinds
        self._tables = tables

    def _create_one(self, stacked, kind, from_checkpoint):
        shard_rows = self.sparse_cores * stacked.rows_per_shard
        # Parameters in the stacked table's storage dtype (numpy views of 16-bit variables are
        # ml_dtypes arrays: writing float32 into them rounds to nearest); slots in float32.
        dtype = tf.as_dtype(stacked.dtype) if kind == PARAMETERS else tf.float32
        shards = {r: zeros_variable((shard_rows, self.stored_width(stacked, kind)),
                                    f"{stacked.name}/{kind}/replica_{r}", self.group.device_of(r),
                                    dtype)
                  for r in self.group.local_replica_ids}
        sharded = ShardedTable(f"{stacked.name}/{kind}", shards)
        slot_initializers = dict(zip(stacked.optimizer.slot_names,
                                     stacked.optimizer.slot_initializers))
        views = dict(zip(sorted(shards), _writable_views(sharded.shards)))
        for table in stacked.tables:
            reader = from_checkpoint(table.name, kind) if from_checkpoint else None
            if reader is not None:
                if kind != PARAMETERS:
                    self._fill_slot_padding(views, table.name, slot_initializers[kind])
                self._place_chunks(views, table.name, kind, reader)
                continue
            layout = table.layout
            if kind == PARAMETERS:
                shape = [layout.height, layout.width]
                read = _initial_rows(table.config.initializer, shape, f"table '{table.name}'")
            else:   # slots are initialized over the whole padded region, like on SparseCore
                shape = [layout.padded_height, self.stored_width(stacked, kind)]
                read = _initial_rows(slot_initializers[kind], shape,
                                    f"slot '{kind}' of '{table.name}'")
            for first, stop in logical_chunks(shape[0]):
                self._place(views, table.name, first, read(first, stop),
                            height_limit=shape[0], width=shape[1])
            del read
        del views   # drop the views: the variables' buffers are exclusively theirs again
        return sharded

    def _fill_slot_padding(self, views, table_name, initializer):
        """A slot's padded region takes its constant initial value (as a fresh build would)."""
        value = constant_initializer_value(initializer)
        if not value:
            return
        blocks = self._blocks[table_name]
        for _, replica, start, _ in blocks.blocks:
            for holder in self._holders(table_name, replica):
                views[holder][start:start + blocks.rows_per_residue, :] = value

    # -- logical -> storage
    def _place(self, views, table_name, first_row, values, height_limit=None, width=None):
        """Writes logical rows [first_row, first_row + len(values)) into the local views (their
        first `width` columns: by default, all the values' columns)."""
        blocks = self._blocks[table_name]
        n = blocks.n
        width = values.shape[1] if width is None else width
        height = blocks.layout.height if height_limit is None else height_limit
        stop = min(first_row + len(values), height)
        for k, replica, start, _ in blocks.blocks:
            r0 = first_row + (k - first_row) % n     # first row >= first_row with r % n == k
            if r0 >= stop:
                continue
            count = (stop - 1 - r0) // n + 1
            j0 = r0 // n
            for holder in self._holders(table_name, replica):
                views[holder][start + j0:start + j0 + count, :width] = \
                    values[r0 - first_row:stop - first_row:n]

    def _place_chunks(self, views, table_name, kind, reader):
        width = self.logical_width(table_name, kind)
        for first, stop in logical_chunks(self.placement(table_name).layout.height):
            chunk = reader(first, stop)
            self._place(views, table_name, first, chunk, width=width)
            del chunk

    def write_logical_rows(self, table_name, kind, first_row, values):
        """Writes logical rows [first_row, first_row + len(values)) of a table's parameters or slot.

        Only the rows held by this process are written; padding rows and columns keep their
        values. Writes go through views of the variables' buffers; when a variable is in
        copy-on-read mode (someone used a sparse TensorFlow op on it), through scatter_update.
        """
        placement = self.placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        width = self.logical_width(table_name, kind)
        try:
            views = dict(zip(sorted(sharded.shards_by_replica), _writable_views(sharded.shards)))
        except _CopyOnRead:
            self._write_with_ops(sharded, table_name, first_row, np.asarray(values), width)
            return
        self._place(views, table_name, first_row, np.asarray(values), width=width)
        del views

    def storage_rows(self, table_name, logical_rows):
        """(replica, row in that replica's variable) of each logical row (int32 tensors), in a
        step: where the ops that write single rows (an open vocabulary's new rows) find them.
        A replicated table's rows are on every replica: the replica given is 0."""
        blocks = self._blocks[table_name]
        starts = tf.constant([start for _, _, start, _ in blocks.blocks], tf.int32)
        replicas = tf.constant([replica for _, replica, _, _ in blocks.blocks], tf.int32)
        logical_rows = tf.convert_to_tensor(logical_rows, tf.int32)
        residue = logical_rows % blocks.n
        return (tf.gather(replicas, residue),
                tf.gather(starts, residue) + logical_rows // blocks.n)

    def write_logical(self, table_name, kind, reader_or_value):
        """Writes a whole logical table: a numpy array, or a chunk reader (first, stop) -> rows."""
        if callable(reader_or_value):
            for first, stop in logical_chunks(self.placement(table_name).layout.height):
                chunk = reader_or_value(first, stop)
                self.write_logical_rows(table_name, kind, first, chunk)
                del chunk
        else:
            self.write_logical_rows(table_name, kind, 0, reader_or_value)

    def _write_with_ops(self, sharded, table_name, first_row, values, width):
        blocks = self._blocks[table_name]
        n = blocks.n
        stop = min(first_row + len(values), blocks.layout.height)
        for k, replica, start, _ in blocks.blocks:
            r0 = first_row + (k - first_row) % n
            if r0 >= stop:
                continue
            count = (stop - 1 - r0) // n + 1
            indices = np.arange(start + r0 // n, start + r0 // n + count)
            for holder in self._holders(table_name, replica):
                variable = sharded.shard(holder)
                with tf.device(variable.device):
                    current = tf.gather(variable, indices).numpy()
                    current[:, :width] = values[r0 - first_row:stop - first_row:n]
                    variable.scatter_update(tf.IndexedSlices(current, indices))

    # -- single rows held by this process (delta exports, docs/deltas.md)
    def logical_rows_at(self, stacked_name, replica, local_rows):
        """{table name: ascending logical rows} stored at `local_rows` (ascending) of a local
        replica's variable of a stacked table; rows of no table (padding) are dropped."""
        local_rows = np.asarray(local_rows, np.int64)
        found = {}
        for table in self.plan.stacked_tables[stacked_name].tables:
            blocks = self._blocks[table.name]
            parts = []
            for k, block_replica, start, count in blocks.blocks:
                if replica not in self._holders(table.name, block_replica):
                    continue
                lo, hi = np.searchsorted(local_rows, [start, start + count])
                parts.append((local_rows[lo:hi] - start) * blocks.n + k)
            rows = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
            if len(rows):
                found[table.name] = rows
        return found

    def _row_locations(self, table_name, logical_rows):
        """(replica holding each row or -1 when no local replica does, its row there)."""
        blocks = self._blocks[table_name]
        rows = np.asarray(logical_rows, np.int64)
        k = rows % blocks.n
        table = np.array([(b[1], b[2]) for b in blocks.blocks], np.int64).reshape(-1, 2)
        replicas, starts = table[k, 0], table[k, 1] + rows // blocks.n
        if table_name in self._replicated:
            replicas = np.full(len(rows), self.group.local_replica_ids[0], np.int64)
        else:
            replicas = np.where(np.isin(replicas, self.group.local_replica_ids), replicas, -1)
        return replicas, starts

    def read_rows(self, table_name, kind, logical_rows):
        """[len(rows), width] float32 values of logical rows that this process holds (every row
        given must be held here: see logical_rows_at)."""
        placement = self.placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        width = self.logical_width(table_name, kind)
        replicas, local = self._row_locations(table_name, logical_rows)
        out = np.empty((len(local), width), np.float32)
        for replica in np.unique(replicas):
            if replica < 0:
                raise ValueError(f"table '{table_name}': rows {np.asarray(logical_rows)[replicas < 0][:4]} "
                                 "are not held by this process")
            view = private_tf.numpy_view(sharded.shard(int(replica)).read_value())
            mine = replicas == replica
            out[mine] = view[local[mine], :width]
            del view
        return out

    def write_rows(self, table_name, kind, logical_rows, values):
        """Writes logical rows (any order, distinct) into every local copy that holds them; rows
        held by other processes are skipped. 16-bit tables round values to nearest (exact for
        values read from such a table)."""
        placement = self.placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        width = self.logical_width(table_name, kind)
        values = np.asarray(values, np.float32)
        replicas, local = self._row_locations(table_name, logical_rows)
        for block_replica in np.unique(replicas[replicas >= 0]):
            mine = replicas == block_replica
            holders = (self.group.local_replica_ids if table_name in self._replicated
                       else (int(block_replica),))
            for holder in holders:
                variable = sharded.shard(holder)
                try:
                    (view,) = _writable_views([variable])
                except _CopyOnRead:
                    with tf.device(variable.device):
                        current = tf.gather(variable, local[mine]).numpy()
                        current[:, :width] = values[mine]
                        variable.scatter_update(tf.IndexedSlices(current, local[mine]))
                    continue
                view[local[mine], :width] = values[mine]
                del view

    # -- storage -> logical
    def _local_contribution(self, sharded, table_name, replica, width):
        """[S * rows_per_residue, width]: the blocks this replica holds, in residue order."""
        blocks = self._blocks[table_name]
        rows = blocks.rows_per_residue
        view = private_tf.numpy_view(sharded.shard(replica).read_value())
        parts = [view[start:start + rows, :width] for _, _, start, _ in blocks.of_replica(replica)]
        return (np.concatenate(parts).astype(np.float32, copy=False) if parts
                else np.zeros((0, width), np.float32))

    def read_logical(self, table_name, kind):
        """The complete logical [vocabulary_size, width] table or slot (64-byte aligned numpy
        array; width: `logical_width`).

        In one process, assembled from zero-copy views of the shards (no memory beyond the
        result). With several worker processes, a collective: every worker must call it.
        """
        placement = self.placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        blocks = self._blocks[table_name]
        layout = blocks.layout
        width = self.logical_width(table_name, kind)
        out = aligned_empty((layout.padded_height, width))
        blocked = out.reshape(blocks.rows_per_residue, blocks.n, width)
        if not self.group.is_multi_worker or self.is_replicated(table_name):
            views = {r: private_tf.numpy_view(v.read_value())
                     for r, v in sharded.shards_by_replica.items()}
            for k, replica, start, count in blocks.blocks:
                holder = self._holders(table_name, replica)[0]
                blocked[:count, k, :] = views[holder][start:start + count, :width]
            del views
            return out[:layout.height]
        gathered = self._gather_across_workers(sharded, table_name, width)
        per_replica = self.sparse_cores * blocks.rows_per_residue
        for replica in range(self.num_replicas):
            mine = blocks.of_replica(replica)
            part = gathered[replica * per_replica:(replica + 1) * per_replica]
            for i, (k, _, _, count) in enumerate(mine):
                blocked[:count, k, :] = part[i * blocks.rows_per_residue:
                                             i * blocks.rows_per_residue + count]
        del gathered
        return out[:layout.height]

    def _gather_across_workers(self, sharded, table_name, width):
        strategy = self.group.strategy
        contributions = {r: self._local_contribution(sharded, table_name, r, width)
                         for r in self.group.local_replica_ids}

        def value_fn(context):
            replica = context.replica_id_in_sync_group
            with tf.device(self.group.device_of(replica)):
                return tf.constant(contributions[replica])

        values = strategy.experimental_distribute_values_from_function(value_fn)
        gathered = strategy.gather(values, axis=0)
        del contributions, values
        return gathered.numpy()

    def read_logical_tf(self, table_name, kind):
        """read_logical with TensorFlow ops (graph contexts, e.g. tracing a SavedModel)."""
        if self.group.is_multi_worker and not self.is_replicated(table_name):
            raise NotImplementedError("reading a complete logical table inside a tf.function is "
                                      "not supported with several worker processes: read eagerly")
        placement = self.placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        blocks = self._blocks[table_name]
        layout = blocks.layout
        rows = blocks.rows_per_residue
        width = self.logical_width(table_name, kind)
        pieces = [tf.cast(sharded.shard(self._holders(table_name, replica)[0])[start:start + rows,
                                                                            :width], tf.float32)
                  for _, replica, start, _ in blocks.blocks]
        return tf.reshape(tf.stack(pieces, axis=1),
                          [layout.padded_height, width])[:layout.height]
