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


def create_sharded_tables(stacked, devices, sparse_cores_per_replica):
    """Creates the parameters and slots of one stacked table, one variable per device.

    Returns {"parameters": ShardedTable, <slot name>: ShardedTable, ...}.
    """
    num_replicas = len(devices)
    shard_rows = sparse_cores_per_replica * stacked.rows_per_shard
    width = stacked.padded_width
    optimizer = stacked.optimizer

    def build(kind, make_logical):
        values = [np.zeros((shard_rows, width), np.float32) for _ in devices]
        for table in stacked.tables:
            logical = make_logical(table)
            replica, row = storage_coordinates(table, num_replicas, sparse_cores_per_replica)
            for d in range(num_replicas):
                mask = replica == d
                values[d][row[mask], :] = logical[mask]
        shards = []
        for d, device in enumerate(devices):
            with tf.device(device):
                shards.append(resource_variable_ops.ResourceVariable(
                    values[d], name=f"{stacked.name}/{kind}/replica_{d}", trainable=False))
        return ShardedTable(f"{stacked.name}/{kind}", shards)

    def table_values(table):
        layout = table.layout
        logical = _call_initializer(table.config.initializer, [layout.height, layout.width],
                                    f"table '{table.name}'")
        padded = np.zeros((layout.padded_height, layout.padded_width), np.float32)
        padded[:layout.height, :layout.width] = logical
        return padded

    variables = {"parameters": build("parameters", table_values)}
    for slot, initializer in zip(optimizer.slot_names, optimizer.slot_initializers):
        variables[slot] = build(slot, lambda t, i=initializer: _call_initializer(
            i, [t.layout.padded_height, t.layout.padded_width], f"slot '{slot}' of '{t.name}'"))
    return variables


def read_logical_table(sharded, placement, sparse_cores_per_replica):
    """The user's [vocabulary_size, dim] view of one member table, as a numpy array."""
    num_replicas = len(sharded.shards)
    layout = placement.layout
    replica, row = storage_coordinates(placement, num_replicas, sparse_cores_per_replica,
                                       rows=np.arange(layout.height))
    out = np.empty((layout.height, layout.width), np.float32)
    for d, shard in enumerate(sharded.shards):
        mask = replica == d
        out[mask] = shard.numpy()[row[mask], :layout.width]
    return out
