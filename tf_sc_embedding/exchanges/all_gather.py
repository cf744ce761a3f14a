"""The CSR exchange: one replica, or several that all-gather every replica's ids.

With one replica this is the plain SparseCore path: preprocessing with minibatch splits, CSR
packing and the CSR lookup and fused update kernels. With several replicas
(`exchange="all_gather"`) it implements SparseCore's per-partition limits (minibatching and id
dropping), at the price of bytes that grow with the replica count; the default multi-replica
exchange is all_to_all.py, whose bytes per replica stay flat.

Each replica holds SparseCore shards [d*S, (d+1)*S) of every stacked table. A step:
1. the replicas agree on minibatch splits (OR of every replica's bitmask) and pack CSR buffers
   (one replica has nothing to agree on: its `enqueue` packs them, see `PackedCsr`);
2. the CSR buffers are all-gathered, every replica looks up the rows it holds for *all* samples,
   and a sum all-reduce assembles each replica's activations (forward);
3. activation gradients are all-gathered and every replica applies the fused optimizer to the rows
   it holds, summing contributions from all replicas first (backward).
All cross-replica movement goes through `tf.distribute` collectives of the replica context.
"""
import collections

import tensorflow as tf

from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding import ops
from tf_sc_embedding.exchanges import base

# What apply_gradients needs from the forward pass of one stacked table.
PreservedCsr = collections.namedtuple(
    "PreservedCsr", ["row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
                     "num_minibatches"])

# One replica's CSR buffers, packed by `enqueue` (`AllGatherExchange.preprocess`): with no other
# replica's splits to agree on, the packing belongs to the host preprocessing, as in TensorFlow's
# TPUEmbeddingV2, and runs in the input pipeline when enqueue does. num_dropped: the ids the
# packing dropped (allow_id_dropping), counted when dequeue looks the batch up. grouped: the
# lookup's entries grouped by activation row (GroupedEntries) where `groups_at_enqueue`, else ().
PackedCsr = collections.namedtuple("PackedCsr", ["csr", "num_dropped", "grouped"])

# The outputs of ops.group_lookup_entries (docs/lookup.md#grouping-at-enqueue): what the grouped
# lookup reads instead of the CSR; the fused update still reads the CSR.
GroupedEntries = collections.namedtuple("GroupedEntries", ["row_begin", "rows", "gains"])

# The largest row count the grouping's int32 row index holds.
MAX_GROUPED_TABLE_ROWS = 2 ** 31 - 1

MAX_MINIBATCHES_PER_SPARSE_CORE = 64


def _agreed_splits(view, splits):
    return view.all_or(splits)


def _gathered_ids(view, values, size, pad_value):
    """Gathers a trimmed CSR id buffer, padded to the largest across replicas (equal chunks)."""
    if view.num_replicas == 1:
        return values
    largest = view.all_max(tf.reshape(size, [1]))[0]
    padded = tf.pad(values, [[0, largest - size]], constant_values=pad_value)
    return view.all_gather(padded)


def _pack(layout, stacked, preprocessed, splits, sparse_core_config):
    """The CSR buffers of one replica's preprocessed ids under the agreed `splits`."""
    per_sample = sparse_core_config.max_ids_per_chip_per_sample if sparse_core_config else 64
    allow_dropping = bool(sparse_core_config and sparse_core_config.allow_id_dropping)
    return ops.get_minibatches_in_csr_with_physical_replica(
        tf.constant([""]), preprocessed.sorted_row_ids, preprocessed.sorted_col_ids,
        preprocessed.sorted_gains, splits, preprocessed.id_counts,
        sample_count=stacked.sample_count, num_replica=layout.num_replicas,
        max_minibatches_per_sc=MAX_MINIBATCHES_PER_SPARSE_CORE,
        max_ids_per_chip_per_sample=per_sample, table_vocab_size=stacked.total_rows,
        feature_width=stacked.padded_width, num_sc_per_chip=layout.sparse_cores_per_replica,
        table_name=stacked.name, mini_batch_in_csr="", allow_id_dropping=allow_dropping,
        trim_to_size=True)


def _as_preserved(csr):
    """The PreservedCsr fields of the packing op's outputs."""
    return PreservedCsr(csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids,
                        csr.sorted_gains, csr.num_minibatches_per_physical_sparse_core)


def packs_at_enqueue(layout):
    """Whether enqueue packs the CSR buffers: only one replica has no splits to agree on."""
    return layout.num_replicas == 1


def groups_at_enqueue(layout, stacked):
    """Whether enqueue also groups the lookup's entries by activation row: with one replica (it
    packs the CSR there), unless the table is quantized (that lookup adds in buffer order) or has
    more rows than the grouping's int32 row index holds."""
    return (packs_at_enqueue(layout) and stacked.quantization is None and
            stacked.total_rows <= MAX_GROUPED_TABLE_ROWS)


def group_entries(layout, stacked, csr, feature_rows_per_sc=None):
    """The GroupedEntries of one replica's packed CSR (a PreservedCsr), for the lookup that
    `lookup` runs on it (same activation row order)."""
    row_begin, rows, gains = ops.group_lookup_entries(
        csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids, csr.sorted_gains,
        csr.num_minibatches, input_size=layout.num_replicas * stacked.sample_count,
        table_rows=stacked.total_rows, table_name=stacked.name,
        feature_rows_per_sc=feature_rows_per_sc or (), **shard_arguments(layout, 0))
    return GroupedEntries(row_begin, rows, gains)


def pack_one_replica(layout, stacked, preprocessed, sparse_core_config, feature_rows_per_sc=None):
    """The PackedCsr of the only replica's preprocessed ids: its own splits are the agreed ones.
    `feature_rows_per_sc`: the lookup's activation row order, which the grouping follows."""
    if not packs_at_enqueue(layout):
        raise ValueError(f"stacked table '{stacked.name}': {layout.num_replicas} replicas must "
                         "agree on their minibatch splits before packing (pack_and_gather)")
    csr = _pack(layout, stacked, preprocessed, preprocessed.splits, sparse_core_config)
    preserved = _as_preserved(csr)
    grouped = (group_entries(layout, stacked, preserved, feature_rows_per_sc)
               if groups_at_enqueue(layout, stacked) else ())
    return PackedCsr(preserved, csr.num_dropped_ids, grouped)


def pack_and_gather(view, layout, stacked, preprocessed, sparse_core_config):
    """Agreed splits -> CSR buffers of this replica -> gathered buffers of all replicas.

    Returns (PreservedCsr, number of ids this replica dropped with allow_id_dropping).
    """
    csr = _pack(layout, stacked, preprocessed, _agreed_splits(view, preprocessed.splits),
                sparse_core_config)
    local, pad, size = _as_preserved(csr), 2 ** 31 - 1, csr.ids_unpadded_size
    gathered = local._replace(
        row_pointers=view.all_gather(local.row_pointers),
        sorted_sample_ids=_gathered_ids(view, local.sorted_sample_ids, size, pad),
        sorted_token_ids=_gathered_ids(view, local.sorted_token_ids, size, pad),
        sorted_gains=_gathered_ids(view, local.sorted_gains, size, float(pad)))
    return gathered, csr.num_dropped_ids


def shard_arguments(layout, replica_id):
    """The static shard attributes of this exchange's lookup and update ops on one replica."""
    S = layout.sparse_cores_per_replica
    return dict(num_sparsecores_per_device=S, num_replica=layout.num_replicas,
                num_source_replicas=layout.num_replicas, first_local_shard=replica_id * S,
                num_local_shards=S)


def lookup(view, layout, stacked, csr, table_shard, feature_rows_per_sc=None, grouped=()):
    """This replica's [B_stk, padded_width] activations of one stacked table, in the CSR's row
    order, or feature-major with feature_rows_per_sc (enqueue.feature_major_rows). With the
    `grouped` entries of the same CSR and row order (one replica), the grouped lookup sums them:
    the same bits."""
    if grouped:
        return ops.sparse_dense_matmul_grouped(grouped.row_begin, grouped.rows, grouped.gains,
                                               table_shard, table_name=stacked.name)
    q = stacked.quantization
    partial = ops.xla_sparse_dense_matmul_with_csr_input(
        csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids, csr.sorted_gains,
        table_shard, csr.num_minibatches, input_size=layout.num_replicas * stacked.sample_count,
        quantization_config_low=float(q.lower) if q else 0.0,
        quantization_config_high=float(q.upper) if q else 0.0,
        quantization_config_num_buckets=int(q.num_buckets) if q else 0,
        table_name=stacked.name, feature_rows_per_sc=feature_rows_per_sc or (),
        **shard_arguments(layout, view.replica_id))
    full = view.all_sum(partial)
    start = view.replica_id * stacked.sample_count
    return full[start:start + stacked.sample_count]


def update_inputs(view, csr, gradients):
    """The fused update's inputs on this replica: the gathered CSR and all replicas' gradients
    (the target's arguments are `shard_arguments`)."""
    return fused_update.UpdateInputs(
        csr.row_pointers, csr.sorted_sample_ids, csr.sorted_token_ids, csr.sorted_gains,
        view.all_gather(gradients), csr.num_minibatches)


class AllGatherExchange(base.Exchange):
    """Sharded tables looked up from CSR buffers of every replica's ids (or one replica's)."""

    with_splits = True

    def __init__(self, layout, group, sparse_core_config):
        super().__init__(layout, group)
        self._sparse_core_config = sparse_core_config
        self._feature_major_rows = {name: enqueue_lib.feature_major_rows(layout, stacked)
                                    for name, stacked in layout.stacked_tables.items()}

    def feature_major_rows(self, name):
        return self._feature_major_rows[name]

    def gradient_order(self, name):
        """Per feature (no copy) when the update reads them in place (one replica),
        feature-major when they are all-gathered first, else in the CSR's order."""
        if self.feature_major_rows(name) is None:
            return enqueue_lib.SPARSE_CORE_MAJOR
        return (enqueue_lib.PER_FEATURE if self.layout.num_replicas == 1
                else enqueue_lib.FEATURE_MAJOR)

    def preprocess(self, ids_by_path, weights_by_path, observe_maxima=None):
        """The sorted ids with their splits; with one replica, already packed (PackedCsr)."""
        preprocessed = super().preprocess(ids_by_path, weights_by_path, observe_maxima)
        if not packs_at_enqueue(self.layout):
            return preprocessed   # packed in dequeue, once the replicas agree on the splits
        return {name: pack_one_replica(self.layout, stacked, preprocessed[name],
                                       self._sparse_core_config, self.feature_major_rows(name))
                for name, stacked in self.stacked_tables.items()}

    def _csr(self, view, stacked, preprocessed):
        """The PackedCsr of one stacked table's enqueued ids (gathered from every replica when
        there are several, with nothing grouped)."""
        packed = packs_at_enqueue(self.layout)
        expected = PackedCsr if packed else enqueue_lib.PreprocessedTable
        if not isinstance(preprocessed, expected):
            raise ValueError(f"stacked table '{stacked.name}': dequeue takes what enqueue of this "
                             f"embedding returned ({expected.__name__}), got "
                             f"{type(preprocessed).__name__}")
        if packed:
            grouped = preprocessed.grouped
            if bool(grouped) != groups_at_enqueue(self.layout, stacked) or (
                    grouped and not isinstance(grouped, GroupedEntries)):
                raise ValueError(f"stacked table '{stacked.name}': dequeue takes what enqueue of "
                                 "this embedding returned; its grouped entries do not match this "
                                 "table")
            return preprocessed
        csr, num_dropped = pack_and_gather(view, self.layout, stacked, preprocessed,
                                           self._sparse_core_config)
        return PackedCsr(csr, num_dropped, ())

    def _lookup_stacked(self, view, preprocessed, parameters):
        activations, preserved, dropped = {}, {}, []
        for name, stacked in self.stacked_tables.items():
            csr, num_dropped, grouped = self._csr(view, stacked, preprocessed[name])
            activations[name] = lookup(view, self.layout, stacked, csr, parameters[name],
                                       feature_rows_per_sc=self.feature_major_rows(name),
                                       grouped=grouped)
            preserved[name] = csr
            dropped.append(tf.cast(num_dropped, tf.int64))
        self.group.counter(view.replica_id, collectives.DROPPED_IDS).assign_add(tf.add_n(dropped))
        return activations, preserved

    def is_preserved(self, preserved):
        return (isinstance(preserved, dict) and set(preserved) == set(self.stacked_tables) and
                all(isinstance(v, PreservedCsr) for v in preserved.values()))

    def _update_arguments(self, replica_id):
        return shard_arguments(self.layout, replica_id)

    def update_inputs(self, view, preserved, gradients, flags=None):
        del flags   # never given: this exchange does not carry them
        return {name: update_inputs(view, preserved[name], gradients[name])
                for name in self.stacked_tables}, None
