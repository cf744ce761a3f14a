"""Lookup and fused update of mod-sharded tables with all-to-all exchanges (multi-replica default).

Every replica holds the SparseCore shards [d*S, (d+1)*S) of every stacked table. A step moves
only ids and rows, never activations of the whole global batch (docs/multi_worker.md#exchange):

preprocessing (enqueue), per stacked table of one replica's batch:
0. the stacked COO; then its ids deduplicated and grouped by the replica that owns their shard
   (the owner; ops/id_routing.py), which also counts the partition statistics (stats.py) from
   the same sort;
forward, for all stacked tables at once:
1. every replica learns its receive counts per (source, table): from one all-gather of the
   counts, which also gives the chunk sizes all replicas agree on (TensorFlow's transport, whose
   all-to-all moves equal chunks), or at the head of step 2's chunks (oneCCL's ragged
   all-to-all; collectives/counted.py);
2. one all-to-all sends every owner the unique ids it holds (as rows of its own variable);
3. each owner packs the rows asked for straight from its variables (ScePackGatheredReplicaChunks;
   if any table has quantization, every table's rows are gathered and quantized first) and one
   all-to-all returns them;
4. each replica combines the rows into its activations (gains, combiners) with one weighted
   gather + segment sum per table (ops/segment_sum.py).
backward:
5. each replica reduces its activation gradients to one gradient row per unique id, one
   all-to-all sends them to the owners (with every replica's non-finite gradient marks, one
   extra chunk entry), and each owner applies the fused optimizer kernel once per touched row,
   summing the contributions of all replicas first (a CSR of the received rows, SceOwnerCsr).

Bytes sent per replica per step are (unique ids x 4) + (unique ids x width x 4) x 2, plus the
W x T counts (all-gathered to W - 1 replicas, or riding) and the marks (one float per feature per
peer), plus padding (chunks are as long as the longest; riding: only this replica's longest):
the first part depends on the replica's own batch, not on the number of replicas.
"""
import collections

import tensorflow as tf

from tf_sc_embedding.collectives import wire
from tf_sc_embedding.collectives.counted import CountedAllToAll
from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding.exchanges import base
from tf_sc_embedding.ops import id_routing, replica_chunks
from tf_sc_embedding.ops import segment_sum
from tf_sc_embedding.ops.owner_csr import owner_csr


# Per stacked table, one replica's preprocessed batch: the stacked COO's sample rows and gains, and
# its ids routed to their owners (ops/id_routing.IdRoute: unique rows grouped by owner, unique ids
# per owner, each id's unique id).
RoutedIds = collections.namedtuple("RoutedIds", [
    "row_ids", "gains", "unique_rows", "owner_counts", "unique_positions"])

# Per stacked table, what apply_gradients needs from the forward pass.
ExchangedTable = collections.namedtuple("ExchangedTable", [
    "sample_rows",         # [ids] row of each id's sample in the stacked activations
    "unique_positions",    # [ids] position of each id's unique id in the send order
    "gains",               # [ids] combiner weight of each id
    "received_rows",       # [received] owner side: row of this replica's variable per received id
])
# Shared by all stacked tables of one step: entries per (replica, table) sent and received, and
# the floats per replica chunk of the gradient buffer (counted.CountedAllToAll.chunk).
ExchangeSizes = collections.namedtuple("ExchangeSizes", ["send_counts", "recv_counts",
                                                         "row_chunk"])


def pack_by_replica(values, counts, chunk):
    """One flat buffer [W * chunk] for an all-to-all: chunk d holds, table after table, the
    counts[d, t] entries of values[t] that go to replica d (values[t] is sorted by replica).

    values: per table [n_t] or [n_t, width_t]; counts: [W, T]. One copy of the payload
    (ops/replica_chunks.py).
    """
    return replica_chunks.pack_replica_chunks(values, counts, chunk)


def unpack_by_replica(buffer, counts, widths, row_multiples=None):
    """Inverse of pack_by_replica: per table, the entries of every replica's chunk, in replica
    order ([n_t] where widths[t] is None, else [n_t, widths[t]]), padded with zero entries to a
    multiple of row_multiples[t] if given. The buffer holds one equal chunk per row of counts."""
    return replica_chunks.unpack_replica_chunks(tf.reshape(buffer, [-1]), counts, widths,
                                                row_multiples=row_multiples)


def feature_blocks(layout, stacked):
    """Each feature's rows per SparseCore when stacked table `stacked`'s activations and their
    gradients can be one matrix per feature, written and read in place by the segment sums
    (ops/segment_sum.py; no split of the activations, no concatenation of the gradients), else
    None (one feature, features that do not tile every SparseCore's rows, or padding columns:
    the activations are then one matrix, sliced per feature; enqueue.feature_major_rows)."""
    return enqueue_lib.feature_major_rows(layout, stacked)


def gradient_order(layout, name):
    """The order the exchange takes stacked table `name`'s gradients in (enqueue.stack_gradients):
    one tensor per feature where feature_blocks allows it."""
    if feature_blocks(layout, layout.stacked_tables[name]) is not None:
        return enqueue_lib.PER_FEATURE
    return enqueue_lib.SPARSE_CORE_MAJOR


def all_to_all_flat(view, buffer, payload=None):
    """One all-to-all of a flat buffer of W equal chunks; payload: what it carries (wire.py)."""
    num_replicas = view.num_replicas
    return tf.reshape(view.all_to_all(tf.reshape(buffer, [num_replicas, -1]), payload), [-1])


def quantized(rows, quantization):
    """The lookup kernel's quantization of table values (docs/optimizers.md#quantization)."""
    if quantization is None:
        return rows
    low, high = float(quantization.lower), float(quantization.upper)
    quantum = (high - low) / float(quantization.num_buckets - 1)
    clipped = tf.clip_by_value(rows, low, high)
    return tf.math.floor((clipped - low) / quantum + 0.5) * quantum + low


def route(layout, coo_by_table, observe_maxima=None):
    """Step 0: {stacked name: RoutedIds} of one replica's stacked COO ({name: PreprocessedCoo}).

    observe_maxima, if given, is called with {stacked name: (max ids, max unique ids)} per
    partition (stats.py), which the routing op counts from its own sort.
    """
    W = layout.num_replicas
    S = layout.sparse_cores_per_replica
    routed, maxima = {}, {}
    for name, table in layout.stacked_tables.items():
        coo = coo_by_table[name]
        ids = id_routing.route_ids_to_owners(
            coo.col_ids, num_replicas=W, sparse_cores_per_replica=S,
            rows_per_shard=table.rows_per_shard, row_ids=coo.row_ids,
            rows_per_sparse_core=table.sample_count // S if observe_maxima is not None else 0,
            table_name=name)
        routed[name] = RoutedIds(coo.row_ids, coo.gains, ids.rows, ids.counts, ids.positions)
        maxima[name] = (ids.max_ids, ids.max_unique_ids)
    if observe_maxima is not None:
        observe_maxima(maxima)   # stateful: runs in tf.function without a dependency
    return routed


def lookup(view, layout, routed_by_table, table_shards):
    """This replica's activations of every stacked table, and what apply_gradients needs.

    routed_by_table: {stacked name: RoutedIds}; table_shards: {stacked name: this replica's
    parameter variable}. Returns ({stacked name: activations}, preserved); the activations are
    one matrix per feature where feature_blocks allows it, else one [B_stk, padded_width].
    """
    S = layout.sparse_cores_per_replica
    stacked = list(layout.stacked_tables.values())
    width_list = [s.padded_width for s in stacked]
    widths = tf.constant(width_list, tf.int32)
    sources = [routed_by_table[table.name] for table in stacked]

    # 1-2. unique ids to their owners (as rows of the owner's variable), with the counts: in an
    # all-gather of their own first, or riding with the ids (collectives/counted.py).
    send_counts = tf.stack([t.owner_counts for t in sources], axis=1)    # [W dest, T]
    counted = CountedAllToAll.start(view, send_counts)
    received, recv_counts = counted.first([t.unique_rows for t in sources])

    # 3. owners read their rows and return them: packed straight from the variables (read in
    # place, not copied), or gathered and quantized first for tables with quantization.
    # 16-bit rows are gathered and widened to float32 first (the packing op copies words).
    variables = [table_shards[table.name].read_value() for table in stacked]
    row_chunk = counted.chunk(recv_counts, widths)
    if all(table.quantization is None and table.dtype == "float32" for table in stacked):
        packed = replica_chunks.pack_gathered_replica_chunks(variables, received, recv_counts,
                                                             row_chunk)
    else:
        packed = pack_by_replica(
            [quantized(tf.cast(tf.gather(v, received[i]), tf.float32), table.quantization)
             for i, (v, table) in enumerate(zip(variables, stacked))], recv_counts, row_chunk)
    recv_rows = counted.all_to_all(packed, recv_counts, widths, wire.ROWS)
    # The owner-side rows the update writes come out only once the tables' values were packed:
    # an update that runs while the values read above are still alive (a pipelined update runs
    # once it has this step's preserved outputs) would copy whole tables to write a few rows.
    with tf.control_dependencies([packed]):
        received = [tf.identity(rows) for rows in received]
    rows_in_send_order = unpack_by_replica(recv_rows, send_counts, width_list)

    # 4. rows -> activations: one matrix per feature where feature_blocks allows it.
    activations, preserved = {}, {}
    for i, table in enumerate(stacked):
        coo = sources[i]
        unique_positions = coo.unique_positions
        blocks = feature_blocks(layout, table)
        if blocks is not None:
            activations[table.name] = segment_sum.gathered_segment_sum_to_features(
                rows_in_send_order[i], unique_positions, coo.gains, coo.row_ids, S, blocks,
                table_name=table.name)
        else:
            activations[table.name] = segment_sum.gathered_segment_sum(
                rows_in_send_order[i], unique_positions, coo.gains, coo.row_ids,
                table.sample_count, table_name=table.name)
        preserved[table.name] = ExchangedTable(
            sample_rows=coo.row_ids, unique_positions=unique_positions, gains=coo.gains,
            received_rows=received[i])
    gradient_chunk = counted.chunk(send_counts, widths)
    return activations, (preserved, ExchangeSizes(send_counts, recv_counts, gradient_chunk))


def exchange_gradients(view, layout, preserved, gradients, flags=None, padded=True):
    """Step 5: one gradient row per unique id, sent to its owner.

    Returns ({stacked name: (rows of the owner's variable, [received, padded_width] gradients)}
    of the rows this replica owns (several entries per row when several replicas touched it;
    with `padded`, the gradients are followed by zero rows up to a multiple of S, as the owner's
    update reads them), agreed flags). `gradients` are in gradient_order. `flags` (int32 [F] of 0 and 1, e.g. this replica's non-finite gradient marks)
    ride in the same all-to-all as floats, one extra chunk entry per replica, so that agreeing on
    them costs no launch of its own; the agreed flags are their elementwise max over all replicas
    (None without flags).
    """
    tables, sizes = preserved
    stacked = list(layout.stacked_tables.values())
    S = layout.sparse_cores_per_replica
    per_unique = []
    for i, table in enumerate(stacked):
        state = tables[table.name]
        unique = tf.reduce_sum(sizes.send_counts[:, i])
        blocks = feature_blocks(layout, table)
        if blocks is not None:
            per_unique.append(segment_sum.gathered_segment_sum_from_features(
                gradients[table.name], state.sample_rows, state.gains, state.unique_positions,
                unique, S, blocks, table_name=table.name))
        else:
            per_unique.append(segment_sum.gathered_segment_sum(
                gradients[table.name], state.sample_rows, state.gains, state.unique_positions,
                unique, table_name=table.name))
    widths = [t.padded_width for t in stacked]
    multiples = [S if padded else 1] * len(stacked)
    send_counts, recv_counts, chunk = sizes.send_counts, sizes.recv_counts, sizes.row_chunk
    if flags is not None:
        W, count = view.num_replicas, int(flags.shape[0])
        ones = tf.ones([W, 1], tf.int32)
        per_unique.append(tf.tile(tf.cast(flags, tf.float32)[None, :], [W, 1]))
        send_counts = tf.concat([send_counts, ones], axis=1)
        recv_counts = tf.concat([recv_counts, ones], axis=1)
        widths.append(count)
        multiples.append(1)
        chunk = chunk + count
    counted = CountedAllToAll(view, send_counts)
    received = unpack_by_replica(
        counted.all_to_all(pack_by_replica(per_unique, send_counts, chunk), send_counts,
                           tf.constant(widths, tf.int32), wire.GRADIENTS),
        recv_counts, widths, row_multiples=multiples)
    agreed = None
    if flags is not None:
        agreed = tf.cast(tf.reduce_max(received.pop(), axis=0), tf.int32)
    return ({table.name: (tables[table.name].received_rows, received[i])
             for i, table in enumerate(stacked)}, agreed)


def owned_rows_arguments(layout, replica_id):
    """The static shard attributes of the update of rows a replica owns (one source replica)."""
    S = layout.sparse_cores_per_replica
    return dict(num_sparsecores_per_device=S, num_replica=layout.num_replicas,
                num_source_replicas=1, first_local_shard=replica_id * S, num_local_shards=S)


def owned_rows_inputs(layout, replica_id, rows_and_gradients, padded=False):
    """The fused update's inputs for rows of this replica's variables (duplicates are summed).

    rows_and_gradients: {stacked name: (rows, [n, padded_width] gradients)}, gradient i for row i
    (padded: followed by zero rows up to a multiple of S, as exchange_gradients returns them).
    Returns {stacked name: fused_update.UpdateInputs} (the target's arguments are
    `owned_rows_arguments`).
    """
    W = layout.num_replicas
    S = layout.sparse_cores_per_replica
    inputs = {}
    for table in layout.stacked_tables.values():
        rows, grads = rows_and_gradients[table.name]
        csr = owner_csr(rows, num_replicas=W, sparse_cores_per_replica=S,
                        rows_per_shard=table.rows_per_shard, replica_id=replica_id,
                        table_name=table.name)
        if not padded:
            grads = tf.pad(grads, [[0, csr.activation_rows - tf.shape(grads)[0]], [0, 0]])
        inputs[table.name] = fused_update.UpdateInputs(
            csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids, csr.sorted_gains,
            grads, tf.constant(1))
    return inputs


def is_exchanged(preserved, layout):
    """Whether `preserved` has the structure `lookup` returns for `layout`."""
    if not (isinstance(preserved, tuple) and len(preserved) == 2):
        return False
    tables, sizes = preserved
    return (isinstance(tables, dict) and set(tables) == set(layout.stacked_tables) and
            all(isinstance(v, ExchangedTable) for v in tables.values()) and
            isinstance(sizes, ExchangeSizes))


def preprocess_and_route(exchange, ids_by_path, weights_by_path, observe_maxima=None):
    """The preprocessing of an exchange that runs `lookup`: the stacked COO, then `route`."""
    coo = base.Exchange.preprocess(exchange, ids_by_path, weights_by_path)
    return route(exchange.layout, coo, observe_maxima)


class AllToAllExchange(base.Exchange):
    """Sharded tables over several replicas: unique ids to their owners, rows back."""

    carries_flags = True

    def preprocess(self, ids_by_path, weights_by_path, observe_maxima=None):
        return preprocess_and_route(self, ids_by_path, weights_by_path, observe_maxima)

    def _lookup_stacked(self, view, preprocessed, parameters):
        return lookup(view, self.layout, preprocessed, parameters)

    def is_preserved(self, preserved):
        return is_exchanged(preserved, self.layout)

    def gradient_order(self, name):
        return gradient_order(self.layout, name)

    def _update_arguments(self, replica_id):
        return owned_rows_arguments(self.layout, replica_id)

    def update_inputs(self, view, preserved, gradients, flags=None):
        received, agreed = exchange_gradients(view, self.layout, preserved, gradients, flags)
        return owned_rows_inputs(self.layout, view.replica_id, received, padded=True), agreed
