"""Lookup and fused update of mod-sharded tables with all-to-all exchanges (multi-replica default).

Every replica holds the SparseCore shards [d*S, (d+1)*S) of every stacked table. A step moves
only ids and rows, never activations of the whole global batch (docs/multi_worker.md#exchange):

forward, for all stacked tables at once:
1. each replica deduplicates the ids of its batch per table and sorts the unique ids by the
   replica that owns their shard (the owner); the counts per (owner, table) go out in one
   all-to-all, and one max-reduce agrees on the chunk sizes;
2. one all-to-all sends every owner the unique ids it holds (as rows of its own variable);
3. each owner looks its rows up with the lookup kernel (a CSR whose entries are the received
   ids, so the variable is read in place) and one all-to-all returns the rows;
4. each replica combines the rows into its activations (gains, combiners) with segment sums.
backward:
5. each replica reduces its activation gradients to one gradient row per unique id, one
   all-to-all sends them to the owners, and each owner applies the fused optimizer kernel once per
   touched row, summing the contributions of all replicas first (the same CSR as in 3).

Bytes sent per replica per step are (unique ids x 4) + (unique ids x width x 4) x 2 plus W
counts per table: they depend on the replica's own batch, not on the number of replicas.
"""
import collections

import tensorflow as tf

from tf_sc_embedding import ops

_PAD = 2 ** 31 - 1
_XLA_PAD = 8

# Per stacked table, what apply_gradients needs from the forward pass.
ExchangedTable = collections.namedtuple("ExchangedTable", [
    "sample_rows",         # [ids] row of each id's sample in the stacked activations
    "unique_positions",    # [ids] position of each id's unique id in the send order
    "gains",               # [ids] combiner weight of each id
    "send_row_positions",  # [unique] first float of each unique id's row in the send buffer
    "received_rows",       # [received] owner side: row of this replica's variable per received id
    "recv_row_positions",  # [received] owner side: first float of each received id's row
])
# Shared by all stacked tables of one step.
ExchangeSizes = collections.namedtuple("ExchangeSizes", ["row_chunk"])


def _exclusive_cumsum(x, axis=0):
    return tf.math.cumsum(x, axis=axis, exclusive=True)


def _entry_positions(counts, chunk, offsets, width):
    """First flat position of every entry of segments laid out one per chunk.

    Segment s (counts[s] entries, `width` values each) starts at s * chunk + offsets[s]; entries
    are numbered segment by segment.
    """
    num = tf.shape(counts, out_type=tf.int32)[0]
    segment = tf.repeat(tf.range(num, dtype=tf.int32), counts)
    rank = tf.range(tf.reduce_sum(counts), dtype=tf.int32) - tf.repeat(_exclusive_cumsum(counts),
                                                                         counts)
    return segment * chunk + tf.gather(offsets, segment) + rank * width


def _pack(parts, size):
    """Scatters (values [n, width], first positions [n], width) of every table into one buffer."""
    indices, values = [], []
    for rows, positions, width in parts:
        index = positions[:, None] + tf.range(width, dtype=tf.int32)[None, :]
        indices.append(tf.reshape(index, [-1, 1]))
        values.append(tf.reshape(rows, [-1]))
    return tf.scatter_nd(tf.concat(indices, 0), tf.concat(values, 0), [size])


def _unpack(buffer, positions, width):
    index = positions[:, None] + tf.range(width, dtype=tf.int32)[None, :]
    return tf.gather(buffer, index)


def _quantized(rows, quantization):
    """The lookup kernel's quantization of table values (docs/optimizers.md#quantization)."""
    if quantization is None:
        return rows
    low, high = float(quantization.lower), float(quantization.upper)
    quantum = (high - low) / float(quantization.num_buckets - 1)
    clipped = tf.clip_by_value(rows, low, high)
    return tf.math.floor((clipped - low) / quantum + 0.5) * quantum + low


def lookup(view, layout, coo_by_table, table_shards):
    """This replica's activations of every stacked table, and what apply_gradients needs.

    coo_by_table: {stacked name: PreprocessedCoo}; table_shards: {stacked name: this replica's
    parameter variable}. Returns ({stacked name: [B_stk, padded_width]}, preserved).
    """
    W = layout.num_replicas
    S = layout.sparse_cores_per_replica
    stacked = list(layout.stacked_tables.values())
    widths = tf.constant([s.padded_width for s in stacked], tf.int32)

    # 1. unique ids per table, sorted by owner; counts and chunk sizes.
    sources = []
    for table in stacked:
        coo = coo_by_table[table.name]
        unique, inverse = tf.unique(coo.col_ids, out_idx=tf.int32)
        shard = unique % table.num_sparse_cores
        owner = shard // S
        local = (shard % S) * table.rows_per_shard + unique // table.num_sparse_cores
        order = tf.argsort(owner, stable=True)
        sources.append(dict(coo=coo, inverse=inverse, order=order, local=tf.gather(local, order),
                            counts=tf.math.bincount(owner, minlength=W, maxlength=W,
                                                    dtype=tf.int32)))
    send_counts = tf.stack([t["counts"] for t in sources], axis=1)          # [W dest, T]
    recv_counts = view.all_to_all(send_counts)                              # [W source, T]
    send_floats = send_counts * widths[None, :]
    chunks = view.all_max(tf.stack([tf.reduce_max(tf.reduce_sum(send_counts, axis=1)),
                                    tf.reduce_max(tf.reduce_sum(send_floats, axis=1))]))
    id_chunk, row_chunk = chunks[0], chunks[1]
    send_id_offsets = _exclusive_cumsum(send_counts, axis=1)
    send_row_offsets = _exclusive_cumsum(send_floats, axis=1)
    recv_id_offsets = _exclusive_cumsum(recv_counts, axis=1)
    recv_row_offsets = _exclusive_cumsum(recv_counts * widths[None, :], axis=1)

    # 2. unique ids to their owners (as rows of the owner's variable).
    id_positions = [_entry_positions(send_counts[:, i], id_chunk, send_id_offsets[:, i], 1)
                    for i in range(len(stacked))]
    send_ids = tf.scatter_nd(tf.concat(id_positions, 0)[:, None],
                             tf.concat([t["local"] for t in sources], 0), [W * id_chunk])
    recv_ids = tf.reshape(view.all_to_all(tf.reshape(send_ids, [W, -1])), [-1])

    # 3. owners read their rows (the variable is read in place, not copied) and return them.
    response, owners = [], []
    for i, table in enumerate(stacked):
        counts = recv_counts[:, i]
        received = tf.gather(recv_ids, _entry_positions(counts, id_chunk, recv_id_offsets[:, i],
                                                        1))
        rows = _quantized(tf.gather(table_shards[table.name].read_value(), received),
                          table.quantization)
        positions = _entry_positions(counts, row_chunk, recv_row_offsets[:, i],
                                     table.padded_width)
        response.append((rows, positions, table.padded_width))
        owners.append(dict(received_rows=received, recv_row_positions=positions))
    recv_rows = tf.reshape(
        view.all_to_all(tf.reshape(_pack(response, W * row_chunk), [W, -1])), [-1])

    # 4. rows -> activations.
    activations, preserved = {}, {}
    for i, table in enumerate(stacked):
        source = sources[i]
        positions = _entry_positions(send_counts[:, i], row_chunk, send_row_offsets[:, i],
                                     table.padded_width)
        rows_in_send_order = _unpack(recv_rows, positions, table.padded_width)
        unique_positions = tf.gather(tf.math.invert_permutation(source["order"]),
                                     source["inverse"])
        coo = source["coo"]
        contributions = tf.gather(rows_in_send_order, unique_positions) * coo.gains[:, None]
        activations[table.name] = tf.math.unsorted_segment_sum(contributions, coo.row_ids,
                                                               table.sample_count)
        preserved[table.name] = ExchangedTable(
            sample_rows=coo.row_ids, unique_positions=unique_positions, gains=coo.gains,
            send_row_positions=positions, **owners[i])
    return activations, (preserved, ExchangeSizes(row_chunk))


def _owner_csr(local_rows, rows_per_shard, sparse_cores, num_replicas, replica_id):
    """A CSR (one source replica, one minibatch) whose entry j updates local row local_rows[j].

    Entries are sorted by shard; entry j of that order is sample j % M of source SparseCore j // M
    (M = ceil(n / S)), so the fused update kernel reads its gradient from activation row j.
    Segments start 8-aligned, as the CSR format requires (docs/preprocessing.md#csr).
    Returns (row_pointers, sample_ids, token_ids, gains, order, rows): `order[j]` is the index
    of entry j in local_rows, `rows` = S * M activation rows.
    """
    S = sparse_cores
    block = -(-(S * num_replicas) // _XLA_PAD) * _XLA_PAD
    n = tf.size(local_rows, out_type=tf.int32)
    per_sc = (n + S - 1) // S
    local_shard = local_rows // rows_per_shard
    order = tf.argsort(local_shard, stable=True)
    shard_sorted = tf.gather(local_shard, order)
    token_sorted = tf.gather(local_rows, order) - shard_sorted * rows_per_shard
    j = tf.range(n, dtype=tf.int32)
    source_sc = j // tf.maximum(per_sc, 1)
    key = source_sc * block + replica_id * S + shard_sorted
    counts = tf.math.bincount(key, minlength=S * block, maxlength=S * block, dtype=tf.int32)
    padded = (counts + _XLA_PAD - 1) // _XLA_PAD * _XLA_PAD
    begin = _exclusive_cumsum(padded)
    slot = (tf.gather(begin, key) + j - tf.gather(_exclusive_cumsum(counts), key))[:, None]
    total = tf.reduce_sum(padded)
    tokens = tf.tensor_scatter_nd_update(tf.fill([total], _PAD), slot, token_sorted)
    samples = tf.tensor_scatter_nd_update(tf.fill([total], _PAD), slot, j - source_sc * per_sc)
    gains = tf.tensor_scatter_nd_update(tf.fill([total], float(_PAD)), slot,
                                        tf.ones([n], tf.float32))
    return begin + counts, samples, tokens, gains, order, S * per_sc


def exchange_gradients(view, layout, preserved, gradients):
    """Step 5: one gradient row per unique id, sent to its owner.

    Returns {stacked name: (rows of the owner's variable, [received, padded_width] gradients)} of
    the rows this replica owns (several entries per row when several replicas touched it).
    """
    W = layout.num_replicas
    tables, sizes = preserved
    row_chunk = sizes.row_chunk
    stacked = list(layout.stacked_tables.values())
    parts = []
    for table in stacked:
        state = tables[table.name]
        per_id = tf.gather(gradients[table.name], state.sample_rows) * state.gains[:, None]
        per_unique = tf.math.unsorted_segment_sum(
            per_id, state.unique_positions, tf.size(state.send_row_positions))
        parts.append((per_unique, state.send_row_positions, table.padded_width))
    received = tf.reshape(view.all_to_all(tf.reshape(_pack(parts, W * row_chunk), [W, -1])),
                          [-1])
    return {table.name: (tables[table.name].received_rows,
                         _unpack(received, tables[table.name].recv_row_positions,
                                 table.padded_width))
            for table in stacked}


def update_owned_rows(layout, replica_id, rows_and_gradients, variables):
    """The fused optimizer update of rows of this replica's variables (duplicates are summed).

    rows_and_gradients: {stacked name: (rows, [n, padded_width] gradients)}; variables:
    {stacked name: (parameter variable, [slot variables in the optimizer's order])}.
    """
    W = layout.num_replicas
    S = layout.sparse_cores_per_replica
    updates = []
    for table in layout.stacked_tables.values():
        rows, grads = rows_and_gradients[table.name]
        pointers, samples, tokens, gains, order, activation_rows = _owner_csr(
            rows, table.rows_per_shard, S, W, replica_id)
        grads = tf.gather(grads, order)
        grads = tf.pad(grads, [[0, activation_rows - tf.shape(grads)[0]], [0, 0]])
        parameters, slots = variables[table.name]
        definition = ops.OPTIMIZERS[table.optimizer.definition_name]
        updates.append(table.optimizer.apply(
            row_pointers=pointers, sorted_sample_ids=samples, sorted_token_ids=tokens,
            sorted_gains=gains, activation_gradients=grads, embedding_table=parameters,
            num_minibatches_per_physical_sparse_core=tf.constant(1), table_name=table.name,
            num_sparsecores_per_device=S, num_replica=W, num_source_replicas=1,
            first_local_shard=replica_id * S, num_local_shards=S,
            **dict(zip(definition.slots, slots))))
    return updates


def apply_gradients(view, layout, preserved, gradients, variables):
    """Fused optimizer update of the rows this replica owns, from every replica's gradients.

    gradients: {stacked name: [B_stk, padded_width]}; variables: {stacked name: (parameter
    variable, [slot variables in the optimizer's order])} of this replica.
    """
    received = exchange_gradients(view, layout, preserved, gradients)
    return update_owned_rows(layout, view.replica_id, received, variables)


def sparse_allreduce(view, layout, rows_and_gradients):
    """Every replica's (row, gradient row) pairs of replicated tables, summed, on every replica.

    The sparse allreduce of docs/multi_worker.md#replicated-tables in two phases, each one set of
    collectives for all tables: (1) reduce-scatter: each row goes to replica row mod W with an
    all-to-all, which sums the duplicates it receives; (2) all-gather of the reduced slices. A
    replica sends about its own unique rows in (1) and 1/W of the union of all replicas' rows,
    times W-1, in (2): bounded by the table size, whatever the number of replicas.
    Returns {stacked name: (rows, gradients)} in the same order on every replica.
    """
    W = view.num_replicas
    stacked = list(layout.stacked_tables.values())
    widths = tf.constant([s.padded_width for s in stacked], tf.int32)
    # (1) reduce-scatter by owner = row mod W.
    sources = []
    for table in stacked:
        rows, grads = rows_and_gradients[table.name]
        owner = rows % W
        order = tf.argsort(owner, stable=True)
        sources.append((tf.gather(rows, order), tf.gather(grads, order),
                        tf.math.bincount(owner, minlength=W, maxlength=W, dtype=tf.int32)))
    send_counts = tf.stack([c for _, _, c in sources], axis=1)                # [W, T]
    recv_counts = view.all_to_all(send_counts)
    send_floats = send_counts * widths[None, :]
    chunks = view.all_max(tf.stack([tf.reduce_max(tf.reduce_sum(send_counts, axis=1)),
                                    tf.reduce_max(tf.reduce_sum(send_floats, axis=1))]))
    id_chunk, row_chunk = chunks[0], chunks[1]
    id_parts, row_parts = [], []
    for i, (table, (rows, grads, _)) in enumerate(zip(stacked, sources)):
        counts = send_counts[:, i]
        id_parts.append((rows[:, None], _entry_positions(
            counts, id_chunk, _exclusive_cumsum(send_counts, axis=1)[:, i], 1), 1))
        row_parts.append((grads, _entry_positions(
            counts, row_chunk, _exclusive_cumsum(send_floats, axis=1)[:, i], table.padded_width),
            table.padded_width))
    recv_ids = tf.reshape(view.all_to_all(
        tf.reshape(_pack(id_parts, W * id_chunk), [W, -1])), [-1])
    recv_rows = tf.reshape(view.all_to_all(
        tf.reshape(_pack(row_parts, W * row_chunk), [W, -1])), [-1])
    reduced = []
    recv_floats = recv_counts * widths[None, :]
    for i, table in enumerate(stacked):
        counts = recv_counts[:, i]
        ids = _unpack(recv_ids, _entry_positions(
            counts, id_chunk, _exclusive_cumsum(recv_counts, axis=1)[:, i], 1), 1)[:, 0]
        grads = _unpack(recv_rows, _entry_positions(
            counts, row_chunk, _exclusive_cumsum(recv_floats, axis=1)[:, i], table.padded_width),
            table.padded_width)
        unique, inverse = tf.unique(ids, out_idx=tf.int32)
        reduced.append((unique, tf.math.unsorted_segment_sum(grads, inverse, tf.size(unique))))
    # (2) all-gather of the reduced slices (equal shapes: padded to the largest slice).
    mine = tf.stack([tf.size(u, out_type=tf.int32) for u, _ in reduced])             # [T]
    all_counts = tf.reshape(view.all_gather(mine[None, :]), [W, len(stacked)])       # [W, T]
    all_floats = all_counts * widths[None, :]
    id_chunk = tf.reduce_max(tf.reduce_sum(all_counts, axis=1))
    row_chunk = tf.reduce_max(tf.reduce_sum(all_floats, axis=1))
    my_ids = tf.concat([u for u, _ in reduced], 0)
    my_rows = tf.concat([tf.reshape(g, [-1]) for _, g in reduced], 0)
    gathered_ids = tf.reshape(view.all_gather(
        tf.pad(my_ids, [[0, id_chunk - tf.size(my_ids)]])[None, :]), [-1])
    gathered_rows = tf.reshape(view.all_gather(
        tf.pad(my_rows, [[0, row_chunk - tf.size(my_rows)]])[None, :]), [-1])
    result = {}
    for i, table in enumerate(stacked):
        counts = all_counts[:, i]
        ids = _unpack(gathered_ids, _entry_positions(
            counts, id_chunk, _exclusive_cumsum(all_counts, axis=1)[:, i], 1), 1)[:, 0]
        grads = _unpack(gathered_rows, _entry_positions(
            counts, row_chunk, _exclusive_cumsum(all_floats, axis=1)[:, i], table.padded_width),
            table.padded_width)
        result[table.name] = (ids, grads)
    return result
