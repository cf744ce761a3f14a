"""Which rows of an open-vocabulary table each replica's key map starts with, and where every row
lives (docs/dynamic_vocabulary.md#capacity-over-several-replicas).

A dynamic table over W replicas has one key map per replica. Replica r's map holds the keys whose
owner shard (ops.key_row_map.key_owner_shards) is r. The table's `capacity` rows are numbered
0..capacity-1 over all the maps ("rows of the whole table"); replica r's map starts with its even
share, rows [first_row(r), first_row(r) + capacity(r)), which replica r stores. A map whose keys
need more rows than it has borrows free ones from the others in the step (exchanges/dynamic.py),
so a key is refused only when every row of the table is taken; a borrowed row stays where it is
stored, and the map that holds its key answers with it like any other row.

Where row G is stored: G is row i = G - first_row(q) of the share of the replica q whose share
holds it. In the mod sharding of the layout (docs/layout.md#stacking) table row g lands on
SparseCore (g mod N + rotation) mod N, N = W * S, and SparseCores [q * S, (q + 1) * S) are replica
q's. Row i of replica q's share is therefore

    g(q, i) = (i // S) * N + ((q * S + i mod S - rotation) mod N),

the i-th table row on replica q's SparseCores. Each replica's scratch row (read by its keys
without a row) is g(r, capacity(r)), its first row beyond its share. The layout sees
`laid_out_rows` rows, enough for every replica's share and scratch row. With one replica (N = S,
rotation a multiple of S) every row is its own table row and the scratch row is row `capacity`.
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
        """Rows replica `replica`'s map starts with (its share of the rows)."""
        return split_evenly(self.total_capacity, self.num_replicas, replica)

    def first_row(self, replica):
        """The first row of the whole table in replica `replica`'s share."""
        return sum(self.capacity(r) for r in range(replica))

    def map_arguments(self, replica):
        """The rows arguments of replica `replica`'s map (ops.key_row_map.KeyRowMap)."""
        if self.num_replicas == 1:
            return dict(capacity=self.total_capacity)
        return dict(capacity=self.capacity(replica), total_rows=self.total_capacity,
                    first_row=self.first_row(replica))

    def share_of(self, rows):
        """(replica whose share holds each row, the row's index in that share), numpy."""
        rows = np.asarray(rows, np.int64)
        firsts = np.array([self.first_row(r) for r in range(self.num_replicas)], np.int64)
        replicas = np.searchsorted(firsts, rows, side="right") - 1
        return replicas, rows - firsts[replicas]

    def pending_capacity(self, replica, pending_capacity):
        """Replica `replica`'s share of the table's pending_capacity (None: its capacity)."""
        if pending_capacity is None:
            return self.capacity(replica)
        return max(1, split_evenly(int(pending_capacity), self.num_replicas, replica))

    def share_of_tensor(self, rows):
        """share_of for int32 tensors: (replica storing each row, its index in that share)."""
        rows = tf.convert_to_tensor(rows, tf.int32)
        if self.num_replicas == 1:
            return tf.zeros_like(rows), rows
        firsts = tf.constant([self.first_row(r) for r in range(self.num_replicas)], tf.int32)
        replicas = tf.searchsorted(firsts, rows, side="right") - 1
        return replicas, rows - tf.gather(firsts, replicas)

    def placement(self, owners):
        """Where a restored state's keys go (eager): per replica, (rows of the whole table of its
        keys, in the state's order; its own rows that other replicas' keys hold). owners: the
        owner replica of each key, in the state's order. Each replica's keys take its own rows
        first, in order; keys beyond its share take, replica after replica, the rows other
        replicas' keys leave free (their shares' last rows), so a state of at most `capacity`
        keys always fits, whatever the owners."""
        owners = np.asarray(owners, np.int64)
        W = self.num_replicas
        counts = np.bincount(owners, minlength=W)
        spare = []   # rows no key of their own replica takes, replica after replica
        for r in range(W):
            first, held = self.first_row(r), min(int(counts[r]), self.capacity(r))
            spare.extend(range(first + held, first + self.capacity(r)))
        rows = np.zeros(len(owners), np.int64)
        lent = {r: [] for r in range(W)}
        taken = 0
        for r in range(W):
            mine = np.flatnonzero(owners == r)
            own = min(len(mine), self.capacity(r))
            rows[mine[:own]] = self.first_row(r) + np.arange(own)
            extra = len(mine) - own
            borrowed = np.asarray(spare[taken:taken + extra], np.int64)
            taken += extra
            rows[mine[own:]] = borrowed
            for row in borrowed:
                lent[int(self.share_of(np.array([row]))[0][0])].append(int(row))
        return {r: (rows[owners == r], np.asarray(lent[r], np.int64)) for r in range(W)}

    def table_rows(self, rows):
        """The table rows (where they are stored) of rows of the whole table: int32 tensors in a
        step, numpy eagerly (the logical state)."""
        if self.num_replicas == 1:
            return rows
        if isinstance(rows, np.ndarray):
            return self._spread(*self.share_of(rows))
        return self._spread(*self.share_of_tensor(rows))

    def _spread(self, replicas, i):
        """g(q, i) of the module's docstring (numpy or tensors alike)."""
        S, N = self.sparse_cores, self.num_shards
        if isinstance(i, np.ndarray):
            return ((i // S) * N + (replicas * S + i % S - self.rotation) % N).astype(np.int64)
        return (i // S) * N + tf.math.floormod(replicas * S + i % S - self.rotation, N)

    def scratch_row(self, replica):
        """The table row replica `replica`'s keys without a row read (zeros, never trained)."""
        if self.num_replicas == 1:
            return self.total_capacity
        return int(self._spread(np.array([replica]), np.array([self.capacity(replica)]))[0])
