"""Which rows of an open-vocabulary table each replica's key map gives out
(docs/dynamic_vocabulary.md#several-replicas).

A dynamic table over W replicas has one key map per replica. Replica r's map holds the keys whose
owner shard (ops.key_row_map.key_owner_shards) is r, and gives them rows that replica r itself
stores, so a key's values, slots and updates stay with its map. In the mod sharding of the layout
(docs/layout.md#stacking) table row g lands on SparseCore (g mod N + rotation) mod N, N = W * S,
and SparseCores [r * S, (r + 1) * S) are replica r's. Map row i of replica r is therefore

    g(r, i) = (i // S) * N + ((r * S + i mod S - rotation) mod N),

the i-th table row on replica r's SparseCores. The capacity is split evenly, replica r's map
holding capacity(r) rows, and each replica's scratch row (read by its keys without a row) is
g(r, capacity(r)), its first row beyond them. The layout sees `laid_out_rows` rows, enough for
every replica's rows and scratch row. With one replica (N = S, rotation a multiple of S) every map
row is its own table row and the scratch row is row `capacity`.
"""
import numpy as np
import tensorflow as tf


def split_evenly(total, parts, part):
    """Part `part` of `total` split into `parts` near-equal parts (the first ones larger)."""
    return total // parts + (1 if part < total % parts else 0)


class ShardRows:
    """The rows of one dynamic table that each replica's map gives out."""

    def __init__(self, table_name, capacity, num_replicas, sparse_cores_per_replica,
                 rotation=0):
        self.total_capacity = int(capacity)
        self.num_replicas = int(num_replicas)
        self.sparse_cores = int(sparse_cores_per_replica)
        self.num_shards = self.num_replicas * self.sparse_cores
        self.rotation = int(rotation) % self.num_shards
        if self.total_capacity < self.num_replicas:
            raise ValueError(
                f"table '{table_name}': a dynamic table over {self.num_replicas} replicas needs "
                f"at least one row per replica; its vocabulary_size (capacity) is "
                f"{self.total_capacity}")

    @staticmethod
    def laid_out_rows(capacity, num_replicas, sparse_cores_per_replica):
        """The rows the layout gives a dynamic table: every replica's rows and scratch row."""
        largest = -(-int(capacity) // int(num_replicas))
        shards = int(num_replicas) * int(sparse_cores_per_replica)
        if num_replicas == 1:
            return int(capacity) + 1
        return (largest // int(sparse_cores_per_replica) + 1) * shards

    def capacity(self, replica):
        """Rows replica `replica`'s map gives out."""
        return split_evenly(self.total_capacity, self.num_replicas, replica)

    def pending_capacity(self, replica, pending_capacity):
        """Replica `replica`'s share of the table's pending_capacity (None: its capacity)."""
        if pending_capacity is None:
            return self.capacity(replica)
        return max(1, split_evenly(int(pending_capacity), self.num_replicas, replica))

    def table_rows(self, replica, map_rows):
        """Table rows g(replica, i) of map rows i: int32 tensors in a step, numpy eagerly
        (the logical state)."""
        S, N = self.sparse_cores, self.num_shards
        if self.num_replicas == 1:
            return map_rows
        if isinstance(map_rows, np.ndarray):
            i = map_rows.astype(np.int64)
            return ((i // S) * N + (replica * S + i % S - self.rotation) % N).astype(np.int64)
        i = tf.convert_to_tensor(map_rows, tf.int32)
        return (i // S) * N + tf.math.floormod(replica * S + i % S - self.rotation, N)

    def scratch_row(self, replica):
        """The table row replica `replica`'s keys without a row read (zeros, never trained)."""
        return int(self.table_rows(replica, np.array([self.capacity(replica)]))[0])
