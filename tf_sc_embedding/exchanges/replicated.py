"""Replicated tables: every replica holds the whole table, looks it up locally and applies the
same update after a sparse allreduce of the touched rows (docs/multi_worker.md#replicated-tables).

The layout of these tables is the one of a single replica, so the lookup and the reduction of
gradients to one row per unique id are the all-to-all exchange's code run against a replica-local
view (no collective). Only the gradient rows cross replicas, in `sparse_allreduce`.
"""
import tensorflow as tf

from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.exchanges import all_to_all
from tf_sc_embedding.exchanges import base
from tf_sc_embedding.collectives.counted import CountedAllToAll
from tf_sc_embedding.exchanges.all_to_all import pack_by_replica, unpack_by_replica
from tf_sc_embedding.ops.segment_sum import gathered_segment_sum


def _with_ids(ids, rows):
    """[n, width + 1] float32: each row after its int32 id, bit for bit, in column 0, so that ids
    and rows travel in one buffer and one collective (collectives copy bytes, no arithmetic)."""
    return tf.concat([tf.bitcast(ids, tf.float32)[:, None], rows], axis=1)


def _split_ids(rows_with_ids):
    """Inverse of _with_ids: (ids [n], rows [n, width]). The ids are sliced after the bit-cast
    back to int32, so no float op ever touches them (a small id is a denormal float)."""
    return tf.bitcast(rows_with_ids, tf.int32)[:, 0], rows_with_ids[:, 1:]


def sparse_allreduce(view, layout, rows_and_gradients):
    """Every replica's (row, gradient row) pairs of replicated tables, summed, on every replica.

    The sparse allreduce of docs/multi_worker.md#replicated-tables in two phases, each one set of
    collectives for all tables: (1) reduce-scatter: each row goes to replica row mod W with an
    all-to-all, which sums the duplicates it receives; (2) all-gather of the reduced slices. A
    replica sends about its own unique rows in (1) and 1/W of the union of all replicas' rows,
    times W-1, in (2): bounded by the table size, whatever the number of replicas. Each phase is
    two collectives: the counts, then the rows with their ids in column 0 (_with_ids).
    Returns {stacked name: (rows, gradients)} in the same order on every replica.
    """
    W = view.num_replicas
    stacked = list(layout.stacked_tables.values())
    width_list = [s.padded_width + 1 for s in stacked]    # + the id column
    widths = tf.constant(width_list, tf.int32)
    # (1) reduce-scatter by owner = row mod W.
    pairs, counts = [], []
    for table in stacked:
        r, g = rows_and_gradients[table.name]
        owner = r % W
        order = tf.argsort(owner, stable=True)
        pairs.append(_with_ids(tf.gather(r, order), tf.gather(g, order)))
        counts.append(tf.math.bincount(owner, minlength=W, maxlength=W, dtype=tf.int32))
    send_counts = tf.stack(counts, axis=1)                                     # [W, T]
    # Ids ride in float columns here, so the counts cannot: they are gathered on any transport.
    counted = CountedAllToAll.gathered(view, send_counts)
    buffer = pack_by_replica(pairs, send_counts, counted.chunk(send_counts, widths))
    received = unpack_by_replica(counted.all_to_all(buffer, send_counts, widths),
                                 counted.recv_counts, width_list)
    reduced = []
    for ids, g in map(_split_ids, received):
        unique, inverse = tf.unique(ids, out_idx=tf.int32)
        n = tf.size(ids)
        reduced.append(_with_ids(unique, gathered_segment_sum(
            g, tf.range(n), tf.ones([n]), inverse, tf.size(unique))))
    # (2) all-gather of the reduced slices (equal shapes: padded to the largest slice).
    mine = tf.stack([tf.shape(p, out_type=tf.int32)[0] for p in reduced])          # [T]
    all_counts = tf.reshape(view.all_gather(mine[None, :]), [W, len(stacked)])     # [W, T]
    chunk = tf.reduce_max(tf.reduce_sum(all_counts * widths[None, :], axis=1))
    local = pack_by_replica(reduced, tf.reshape(mine, [1, -1]), chunk)
    gathered = unpack_by_replica(view.all_gather(local[None, :]), all_counts, width_list)
    return {table.name: _split_ids(gathered[i]) for i, table in enumerate(stacked)}


class ReplicatedExchange(base.Exchange):
    """Tables held whole by every replica (laid out as for one replica)."""

    def preprocess(self, ids_by_path, weights_by_path, observe_maxima=None):
        # The step observes only the sharded tables' statistics (never given here).
        return all_to_all.preprocess_and_route(self, ids_by_path, weights_by_path, observe_maxima)

    def _lookup_stacked(self, view, preprocessed, parameters):
        del view   # every row is local
        return all_to_all.lookup(collectives.LocalView(), self.layout, preprocessed, parameters)

    def is_preserved(self, preserved):
        return all_to_all.is_exchanged(preserved, self.layout)

    def gradient_order(self, name):
        return all_to_all.gradient_order(self.layout, name)

    def _update_arguments(self, replica_id):
        del replica_id   # every replica holds every shard, as replica 0 of a one-replica layout
        return all_to_all.owned_rows_arguments(self.layout, 0)

    def _counts_skipped_rows(self, replica_id):
        # Every replica skips the same rows; they count once, on replica 0.
        return replica_id == 0

    def update_inputs(self, view, preserved, gradients, flags=None):
        del flags   # never given: this exchange does not carry them
        local_rows, _ = all_to_all.exchange_gradients(collectives.LocalView(), self.layout,
                                                      preserved, gradients, padded=False)
        merged = sparse_allreduce(view, self.layout, local_rows)
        return all_to_all.owned_rows_inputs(self.layout, 0, merged), None
