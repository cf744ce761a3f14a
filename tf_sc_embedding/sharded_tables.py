"""Stacked tables and optimizer slots held as one variable per replica device.

Replica d holds the SparseCore shards [d*S, (d+1)*S) of every stacked table, each shard R rows:
logical row r of a member table lives in shard (r + rotation) mod N at row
row_offset + r // N (spec §2.5). Tables are initialized from their *logical* values (drawn at the
user's [vocabulary_size, dim] shape), so a seeded initializer gives the same logical table on any
number of replicas; padding rows and columns of the parameters are zero.
"""
import inspect

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable.base import ShardInfo


def storage_coordinates(placement, num_replicas, sparse_cores_per_replica, rows=None):
    """(replica, row in that replica's variable) of logical rows `rows` of a user table."""
    layout = placement.layout
    n = num_replicas * sparse_cores_per_replica
    r = np.arange(layout.padded_height) if rows is None else np.asarray(rows)
    shard = (r + layout.sparse_core_shard_rotation) % n
    row_in_shard = layout.sparse_core_shard_row_offset + r // n
    rows_per_shard = layout.total_rows_per_sparse_core_shard
    return shard // sparse_cores_per_replica, (shard % sparse_cores_per_replica) * rows_per_shard + row_in_shard


# Rows generated per call for initializers that accept `shard_info` (bounds peak memory).
_SHARD_INFO_CHUNK_ROWS = 1 << 20


def _accepts_shard_info(initializer):
    try:
        return "shard_info" in inspect.signature(initializer).parameters
    except (TypeError, ValueError):
        return False


def _call_initializer(initializer, shape, what):
    """Evaluates an initializer at a logical shape; chunked through `shard_info` when supported."""
    if initializer is None:
        initializer = tf.initializers.TruncatedNormal(mean=0.0, stddev=1 / np.sqrt(shape[1]))
    if _accepts_shard_info(initializer):
        chunks = []
        for start in range(0, shape[0], _SHARD_INFO_CHUNK_ROWS):
            rows = min(_SHARD_INFO_CHUNK_ROWS, shape[0] - start)
            info = ShardInfo(shape=[rows, shape[1]], offset=[start, 0])
            chunks.append(np.asarray(initializer(shape, tf.float32, shard_info=info), np.float32))
        value = np.concatenate(chunks) if chunks else np.zeros(shape, np.float32)
    else:
        try:
            value = initializer(shape=shape, dtype=tf.float32)
        except TypeError:
            value = initializer(shape, tf.float32)
        value = np.asarray(value, dtype=np.float32)
    if value.shape != tuple(shape):
        raise ValueError(f"{what}: the initializer returned shape {value.shape}, expected {shape}")
    return value


class ShardedTable(tf.Module):
    """One stacked table (or one of its slots): a variable per replica device."""

    def __init__(self, name, shards):
        super().__init__(name=None)
        self.table_name = name
        self.shards = list(shards)

    @property
    def shape(self):
        return tf.TensorShape([sum(v.shape[0] for v in self.shards), self.shards[0].shape[1]])


def create_sharded_tables(stacked, devices, sparse_cores_per_replica, from_checkpoint=None):
    """Creates the parameters and slots of one stacked table, one variable per device.

    `from_checkpoint(table_placement, kind)`, if given, returns the logical [vocabulary_size, dim]
    values of a member table's parameters (kind "parameters") or slot, or None; such values are
    used instead of the initializer (deferred checkpoint restoration).
    Returns {"parameters": ShardedTable, <slot name>: ShardedTable, ...}.
    """
    num_replicas = len(devices)
    shard_rows = sparse_cores_per_replica * stacked.rows_per_shard
    width = stacked.padded_width
    optimizer = stacked.optimizer
    slot_initializers = dict(zip(optimizer.slot_names, optimizer.slot_initializers))

    def build(kind, make_logical, from_checkpoint):
        # The variables are created first (zeros in TensorFlow-owned buffers) and the values are
        # written into them in place, one member table at a time: no second copy of a shard.
        shards = [zeros_variable((shard_rows, width), f"{stacked.name}/{kind}/replica_{d}", device)
                  for d, device in enumerate(devices)]
        sharded = ShardedTable(f"{stacked.name}/{kind}", shards)
        values = writable_views(sharded)
        for table in stacked.tables:
            restored = from_checkpoint(table, kind) if from_checkpoint else None
            if restored is not None:
                # Deferred checkpoint restoration: the checkpointed logical table is used
                # instead of the initializer.
                if kind != "parameters":
                    _fill_slot_padding(values, table, num_replicas, sparse_cores_per_replica,
                                       slot_initializers[kind])
                _place_logical(values, table, num_replicas, sparse_cores_per_replica, restored)
                del restored
                continue
            logical = make_logical(table)
            replica, row = storage_coordinates(table, num_replicas, sparse_cores_per_replica)
            for d in range(num_replicas):
                mask = replica == d
                values[d][row[mask], :] = logical[mask]
            del logical
        del values   # drop the views: the variables' buffers are exclusively theirs again
        return sharded

    def table_values(table):
        layout = table.layout
        logical = _call_initializer(table.config.initializer, [layout.height, layout.width],
                                    f"table '{table.name}'")
        padded = np.zeros((layout.padded_height, layout.padded_width), np.float32)
        padded[:layout.height, :layout.width] = logical
        return padded

    variables = {"parameters": build("parameters", table_values, from_checkpoint)}
    for slot, initializer in zip(optimizer.slot_names, optimizer.slot_initializers):
        variables[slot] = build(slot, lambda t, i=initializer, s=slot: _call_initializer(
            i, [t.layout.padded_height, t.layout.padded_width], f"slot '{s}' of '{t.name}'"),
            from_checkpoint)
    return variables


def read_logical_table(sharded, placement, sparse_cores_per_replica):
    """The user's [vocabulary_size, dim] view of one member table, as a numpy array."""
    return gather_logical(sharded, placement, sparse_cores_per_replica)


# ---------------------------------------------------------------------------------------------
# Logical <-> storage copies without index arrays.
#
# padded_height is a multiple of N (spec §2.2), so logical row j*N + k of a member table lives in
# shard s = (k + rotation) mod N at row row_offset + j: for a fixed k the rows form one contiguous
# block of a shard, and the logical table viewed as [padded_height / N, N, dim] is N strided block
# copies. These helpers hold no temporary beyond the output (or a bounded chunk).

_ALIGN = 64            # EIGEN_MAX_ALIGN_BYTES
_ASSIGN_CHUNK_ROWS = 1 << 18


def aligned_empty(shape, dtype=np.float32):
    """An uninitialized C-contiguous array whose data is 64-byte aligned (zero-copy to TF)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(nbytes + _ALIGN, np.uint8)
    start = (-buffer.ctypes.data) % _ALIGN
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def aligned_zeros(shape, dtype=np.float32):
    out = aligned_empty(shape, dtype)
    out.fill(0)
    return out


def as_tensor_zero_copy(array):
    """An eager tensor sharing `array`'s memory (DLPack); falls back to a copy if impossible."""
    array = np.asarray(array)
    if array.flags.c_contiguous and array.ctypes.data % _ALIGN == 0 and array.size:
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except Exception:  # pylint: disable=broad-except
            pass
    return tf.convert_to_tensor(array)


def _shard_views(sharded):
    """Zero-copy numpy views of the current values of every replica's variable."""
    return [shard.read_value()._numpy() for shard in sharded.shards]  # pylint: disable=protected-access


def _blocks(placement, num_replicas, sparse_cores_per_replica):
    """Per k in [0, N): (replica, first row in its variable, number of logical rows < height)."""
    layout = placement.layout
    n = num_replicas * sparse_cores_per_replica
    rows_per_shard = layout.total_rows_per_sparse_core_shard
    for k in range(n):
        shard = (k + layout.sparse_core_shard_rotation) % n
        start = (shard % sparse_cores_per_replica) * rows_per_shard + \
            layout.sparse_core_shard_row_offset
        count = max(0, -(-(layout.height - k) // n))
        yield k, shard // sparse_cores_per_replica, start, count


def gather_logical(sharded, placement, sparse_cores_per_replica, out=None):
    """The logical [vocabulary_size, dim] table from the shards (64-byte aligned numpy array).

    Holds no memory beyond the result: the shards are read through zero-copy views.
    """
    layout = placement.layout
    num_replicas = len(sharded.shards)
    n = num_replicas * sparse_cores_per_replica
    if layout.padded_height % n:
        raise AssertionError(f"table '{placement.name}': padded height {layout.padded_height} "
                             f"is not a multiple of {n} SparseCores")
    if out is None:
        out = aligned_empty((layout.padded_height, layout.width))
    views = _shard_views(sharded)
    blocked = out[:layout.padded_height].reshape(layout.padded_height // n, n, layout.width)
    for k, replica, start, count in _blocks(placement, num_replicas, sparse_cores_per_replica):
        blocked[:count, k, :] = views[replica][start:start + count, :layout.width]
    del views
    return out[:layout.height]


def gather_logical_tf(sharded, placement, sparse_cores_per_replica):
    """gather_logical with TensorFlow ops (for graph contexts, e.g. SavedModel tracing)."""
    layout = placement.layout
    num_replicas = len(sharded.shards)
    n = num_replicas * sparse_cores_per_replica
    rows = layout.padded_height // n
    pieces = [sharded.shards[replica][start:start + rows, :layout.width]
              for _, replica, start, _ in _blocks(placement, num_replicas,
                                                  sparse_cores_per_replica)]
    return tf.reshape(tf.stack(pieces, axis=1), [layout.padded_height, layout.width])[
        :layout.height]


def assign_logical(sharded, placement, sparse_cores_per_replica, logical):
    """Writes a logical [vocabulary_size, dim] table into the shards, in place.

    Padding rows and columns keep their values. Writes go through views of the variables'
    buffers (no TensorFlow op copies the variables or switches them to copy-on-read); when a
    variable is already in copy-on-read mode (someone used a sparse op on it), `scatter_update`
    in chunks of `_ASSIGN_CHUNK_ROWS` rows is used instead.
    """
    try:
        views = writable_views(sharded)
    except _CopyOnRead:
        _assign_logical_with_ops(sharded, placement, sparse_cores_per_replica, logical)
        return
    _place_logical(views, placement, len(sharded.shards), sparse_cores_per_replica, logical)
    del views


def _assign_logical_with_ops(sharded, placement, sparse_cores_per_replica, logical):
    layout = placement.layout
    logical = np.asarray(logical)
    num_replicas = len(sharded.shards)
    n = num_replicas * sparse_cores_per_replica
    for k, replica, start, count in _blocks(placement, num_replicas, sparse_cores_per_replica):
        variable = sharded.shards[replica]
        for first in range(0, count, _ASSIGN_CHUNK_ROWS):
            rows = min(_ASSIGN_CHUNK_ROWS, count - first)
            indices = np.arange(start + first, start + first + rows)
            with tf.device(variable.device):
                current = tf.gather(variable, indices).numpy()
                current[:, :layout.width] = logical[k + first * n: k + (first + rows) * n: n]
                variable.scatter_update(tf.IndexedSlices(current, indices))


class _CopyOnRead(Exception):
    pass


def writable_views(sharded):
    """Numpy views aliasing the variables' buffers (for in-place writes by the library itself).

    Only valid while no TensorFlow op runs on the variables; drop the views before the next op
    (a kernel that updates in place copies a buffer that is still referenced).
    """
    views = []
    for shard in sharded.shards:
        first = shard.read_value()._numpy()  # pylint: disable=protected-access
        second = shard.read_value()._numpy()  # pylint: disable=protected-access
        if first.ctypes.data != second.ctypes.data:   # copy-on-read mode: reads are copies
            raise _CopyOnRead()
        views.append(first)
        del second
    return views


def zeros_variable(shape, name, device):
    """A float32 resource variable of zeros whose buffer is owned by TensorFlow alone."""
    with tf.init_scope(), tf.device(device):
        variable = resource_variable_ops.UninitializedVariable(
            shape=shape, dtype=tf.float32, name=name, trainable=False)
        # A freshly allocated buffer (an eager Fill, not a cached or folded constant) that the
        # variable adopts; once `zeros` is dropped the variable is its only owner.
        zeros = tf.fill(tf.constant(shape, tf.int64), tf.constant(0.0, tf.float32))
        variable.assign(zeros)
        del zeros
    return variable


def _place_logical(values, placement, num_replicas, sparse_cores_per_replica, logical):
    """assign_logical into numpy device buffers (before the variables exist)."""
    layout = placement.layout
    n = num_replicas * sparse_cores_per_replica
    logical = np.asarray(logical)
    for k, replica, start, count in _blocks(placement, num_replicas, sparse_cores_per_replica):
        values[replica][start:start + count, :layout.width] = logical[k::n]


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


def _fill_slot_padding(values, placement, num_replicas, sparse_cores_per_replica, initializer):
    """Fills a slot's whole padded region with its constant initial value (as a fresh build)."""
    value = constant_initializer_value(initializer)
    if not value:
        return
    layout = placement.layout
    rows = layout.padded_height // (num_replicas * sparse_cores_per_replica)
    for _, replica, start, _ in _blocks(placement, num_replicas, sparse_cores_per_replica):
        values[replica][start:start + rows, :] = value
