"""Host preprocessing: user features -> per stacked table sorted, deduplicated, bucketed ids.

Per feature, `convert_to_list_of_sparse_core_coo_tensors` applies the combiner and the stacking
transform (sample offset, row offset, rotation); per stacked table the features' lists are
concatenated in SparseCore-major order and `get_minibatch_splits_with_physical_replica` sorts,
deduplicates and buckets them and proposes minibatch splits. One
`SceConvertFeaturesToMinibatchSplits` per stacked table does all of this (or, without splits,
one `SceConvertFeaturesToStackedCooTensor` makes the concatenation; the per-feature ops remain
for `compute_sparse_core_stats`).
Packing into CSR buffers waits for the replicas to agree on the splits (see `lookup.py`).
Everything here is plain TensorFlow ops on the host, so it also runs inside
`tf.data.Dataset.map`.
"""
import collections

import tensorflow as tf
from absl import logging

from tf_sc_embedding import ops
from tf_sc_embedding.ops import preprocessing as ops_preprocessing
from tf_sc_embedding.ops.require import require

PreprocessedTable = collections.namedtuple(
    "PreprocessedTable",
    ["sorted_row_ids", "sorted_col_ids", "sorted_gains", "splits", "id_counts"])
# The stacked table's COO before sorting: what the all-to-all exchange consumes.
PreprocessedCoo = collections.namedtuple("PreprocessedCoo", ["row_ids", "col_ids", "gains"])

_INT32_MAX = 2 ** 31 - 1


def tensors_of(structure):
    """Every tensor of a batch or of its preprocessing (composites expanded, None skipped): what a
    step waits for before it changes state, since each exists only once its checks passed."""
    return [t for t in tf.nest.flatten(structure, expand_composites=True)
            if isinstance(t, tf.Tensor)]


def _ids_as_int32(values, path, table_name=None):
    if values.dtype == tf.int32:
        return values
    if values.dtype != tf.int64:
        table = "" if table_name is None else (
            f" (table '{table_name}' has a fixed vocabulary; string and other open-ended keys "
            "need dynamic_vocabularies)")
        raise ValueError(f"feature '{path}': ids must be int32 or int64, got "
                         f"{values.dtype.name}{table}")
    [values] = require(tf.reduce_all(values <= _INT32_MAX), [values],
                       f"feature '{path}': int64 ids above 2^31 - 1 cannot be looked up")
    [values] = require(tf.reduce_all(values >= -_INT32_MAX - 1), [values],
                       f"feature '{path}': int64 ids below -2^31 cannot be looked up")
    return tf.cast(values, tf.int32)


def _weights_values(weights, kind, path):
    if weights is None:
        return tf.constant(1.0, tf.float32)
    if kind == "ragged" and isinstance(weights, tf.RaggedTensor):
        return tf.cast(weights.flat_values, tf.float32)
    if kind == "sparse" and isinstance(weights, tf.SparseTensor):
        return tf.cast(weights.values, tf.float32)
    if kind == "dense" and isinstance(weights, tf.Tensor):
        return tf.reshape(tf.cast(weights, tf.float32), [-1])
    raise ValueError(f"feature '{path}': weights must have the same kind as the ids ({kind})")


def feature_as_id_input(ids, weights, path, table_name=None):
    """(indices_or_row_splits, values, weights, kind) of one feature's input (table_name: its
    table, for errors)."""
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"feature '{path}': ragged ids must have shape [batch, None], got "
                             f"{ids.shape}")
        return (tf.cast(ids.row_splits, tf.int32), _ids_as_int32(ids.values, path, table_name),
                _weights_values(weights, "ragged", path), "ragged")
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank != 2:
            raise ValueError(f"feature '{path}': sparse ids must have rank 2, got {ids.shape}")
        return (tf.cast(ids.indices, tf.int32), _ids_as_int32(ids.values, path, table_name),
                _weights_values(weights, "sparse", path), "sparse")
    if isinstance(ids, (tf.Tensor, tf.Variable)) or hasattr(ids, "dtype"):
        ids = tf.convert_to_tensor(ids)
        return (tf.zeros([0], tf.int32), _ids_as_int32(tf.reshape(ids, [-1]), path, table_name),
                _weights_values(weights, "dense", path), "dense")
    raise ValueError(f"feature '{path}': expected a tf.Tensor, tf.SparseTensor or "
                     f"tf.RaggedTensor, got {type(ids).__name__}")


def feature_coo_lists(layout, flat_features, flat_weights):
    """Per stacked table name, per feature: (FeaturePlacement, its per-SparseCore COO lists).

    Each feature's ids go through the combiner and the stacking transform (sample offset, row
    offset, rotation) with convert_to_list_of_sparse_core_coo_tensors.
    """
    S = layout.sparse_cores_per_replica
    lists = {}
    for placement, ids, weights in zip(layout.features, flat_features, flat_weights):
        indices, values, gains, _ = feature_as_id_input(ids, weights, placement.path,
                                                      placement.table.name)
        table = placement.table
        stacked = layout.stacked_tables[table.layout.stacked_table_name]
        per_sc = ops.convert_to_list_of_sparse_core_coo_tensors(
            indices, values, gains, sample_count=placement.sample_count, num_sc_per_chip=S,
            row_offset=placement.sample_offset, col_offset=table.col_offset,
            col_shift=table.layout.sparse_core_shard_rotation,
            num_sc_shards=layout.num_sparse_cores,
            stacked_table_sample_count=stacked.sample_count, combiner=table.combiner,
            vocabulary_size=table.vocabulary_size, table_name=table.name,
            feature_name=placement.path)
        lists.setdefault(stacked.name, []).append((placement, per_sc))
    return lists


def _stacked_table_inputs(layout, flat_features, flat_weights, positions=False):
    """Per stacked table name, the arguments that its features give the ops taking all features
    of a stacked table: the input lists and the per-feature attributes, in feature order.

    positions: the features' ids are already positions among their stacked table's unique rows
    (an open vocabulary's numbered rows, exchanges/dynamic.py), so each col is its id unchanged:
    no stacking transform (one shard, no offset or rotation) and no vocabulary bound."""
    inputs = {}
    for placement, ids, weights in zip(layout.features, flat_features, flat_weights):
        indices, values, gains, _ = feature_as_id_input(ids, weights, placement.path,
                                                      placement.table.name)
        inputs.setdefault(placement.table.layout.stacked_table_name, []).append(
            (placement, indices, values, gains))
    result = {}
    for name, stacked in layout.stacked_tables.items():
        features = inputs[name]
        placements = [f[0] for f in features]
        if positions:
            cols = dict(col_offsets=[0] * len(placements), col_shifts=[0] * len(placements),
                        vocabulary_sizes=[-1] * len(placements), num_sc_shards=1)
        else:
            cols = dict(col_offsets=[p.table.col_offset for p in placements],
                        col_shifts=[p.table.layout.sparse_core_shard_rotation
                                    for p in placements],
                        vocabulary_sizes=[p.table.vocabulary_size for p in placements],
                        num_sc_shards=layout.num_sparse_cores)
        result[name] = dict(
            indices_or_row_splits_list=[f[1] for f in features],
            values_list=[f[2] for f in features], weights_list=[f[3] for f in features],
            sample_counts=[p.sample_count for p in placements],
            row_offsets=[p.sample_offset for p in placements],
            combiners=[p.table.combiner for p in placements],
            table_names=[p.table.name for p in placements],
            feature_names=[p.path for p in placements],
            num_sc_per_chip=layout.sparse_cores_per_replica,
            stacked_table_sample_count=stacked.sample_count, **cols)
    return result


def stacked_coo(layout, flat_features, flat_weights, positions=False):
    """Per stacked table name, its COO (rows, cols, gains) in SparseCore-major order: the
    concatenation of feature_coo_lists, made by one op per stacked table. positions: see
    _stacked_table_inputs."""
    return {name: ops_preprocessing.convert_features_to_stacked_coo_tensor(**arguments)
            for name, arguments in _stacked_table_inputs(
                layout, flat_features, flat_weights, positions).items()}


def stacked_splits(layout, flat_features, flat_weights):
    """(per stacked table name its PreprocessedTable, per stacked table the (max ids, max unique
    ids) per partition): stacked_coo followed by the minibatch-splits op, made by one op per
    stacked table (docs/preprocessing.md#one-call-per-stacked-table)."""
    result, maxima = {}, {}
    for name, arguments in _stacked_table_inputs(layout, flat_features, flat_weights).items():
        stacked = layout.stacked_tables[name]
        splits = ops_preprocessing.convert_features_to_minibatch_splits(
            **arguments, num_replica=layout.num_replicas, table_vocab_size=stacked.total_rows,
            table_name=name, max_ids_per_partition=stacked.max_ids_per_partition,
            max_unique_ids_per_partition=stacked.max_unique_ids_per_partition)
        result[name] = PreprocessedTable(splits.sorted_row_ids, splits.sorted_col_ids,
                                         splits.sorted_gains, splits.splits, splits.id_counts)
        maxima[name] = (splits.max_ids, splits.max_uniques)
    return result, maxima


def preprocess(layout, flat_features, flat_weights, with_splits=True, observe_maxima=None):
    """Per stacked table name, the PreprocessedTable of one replica's batch.

    Without splits (the all-to-all exchange), the stacked table's COO (PreprocessedCoo) instead;
    that exchange counts the partition statistics when it routes the ids
    (exchanges/all_to_all.route), so observe_maxima is only taken with splits: it is called with
    {stacked table name: (max ids, max unique ids)} as the minibatch-splits op counts them.
    """
    if not with_splits:
        if observe_maxima is not None:
            raise ValueError("preprocess: partition statistics come with the splits (with_splits"
                             "=True) or from the all-to-all exchange's routing")
        coo = stacked_coo(layout, flat_features, flat_weights)
        return {name: PreprocessedCoo(*coo[name]) for name in layout.stacked_tables}
    # One op per stacked table, from the ids to the splits.
    result, maxima = stacked_splits(layout, flat_features, flat_weights)
    if observe_maxima is not None:
        observe_maxima(maxima)   # stateful: runs in tf.function without a dependency
    return result


def feature_major_rows(layout, stacked):
    """Each feature's rows per SparseCore if the lookup can write this stacked table's activations
    feature-major (docs/lookup.md#activation-row-order), else None.

    It can when the table has several features that tile every SparseCore's block of samples in
    order and have no padding columns: each feature's activations are then one contiguous block
    of rows, which unstack_activations splits off without copying.
    """
    S = layout.sparse_cores_per_replica
    features = stacked.features
    sizes = [f.sample_count // S for f in features]
    starts = [f.sample_offset // S for f in features]
    tiled = (starts == [sum(sizes[:i]) for i in range(len(sizes))] and
             sum(sizes) == stacked.sample_count // S)
    if len(features) > 1 and tiled and all(f.table.dim == stacked.padded_width
                                           for f in features):
        return sizes
    return None


def unstack_activations(layout, stacked, activations, feature_major=False):
    """Per feature path, the user's activations (padding columns dropped;
    docs/lookup.md#unstacking-activations-and-stacking-gradients).

    feature_major: the rows are in the order feature_major_rows gives the lookup (then each
    feature's block is split off without a copy); otherwise in the CSR's SparseCore-major order.
    A list or tuple of activations holds every feature's matrix already (the all-to-all
    exchange's segment sums write them so).
    """
    S = layout.sparse_cores_per_replica
    features = stacked.features
    if isinstance(activations, (list, tuple)):
        parts = list(activations)
    elif feature_major:
        parts = tf.split(activations, [f.sample_count for f in features], axis=0)
    else:
        blocks = tf.reshape(activations, [S, stacked.sample_count // S, stacked.padded_width])
        sizes = [f.sample_count // S for f in features]
        starts = [f.sample_offset // S for f in features]
        if feature_major_rows(layout, stacked) is not None:
            # One split op (one pass over the activations) instead of a slice per feature.
            parts = tf.split(blocks, sizes, axis=1)
        else:
            parts = [blocks[:, start:start + size, :f.table.dim]
                     for f, start, size in zip(features, starts, sizes)]
    return {f.path: tf.reshape(part, list(f.output_shape) + [f.table.dim])
            for f, part in zip(features, parts)}


# The orders stack_gradients can give a stacked table's gradients in.
SPARSE_CORE_MAJOR = "sparse_core_major"   # one tensor in the CSR's order
FEATURE_MAJOR = "feature_major"           # one tensor, each feature's block in turn
PER_FEATURE = "per_feature"               # a list: every feature's gradient as it is


def stack_gradients(layout, stacked, gradients_by_path, order=SPARSE_CORE_MAJOR):
    """Inverse of unstack_activations; a None gradient becomes zeros (with a warning).

    order: SPARSE_CORE_MAJOR for an update whose CSR numbers activation rows SparseCore-major;
    FEATURE_MAJOR or PER_FEATURE (no copy at all) for an update given feature_major_rows as its
    feature_rows_per_sc (docs/optimizers.md#gradient-order), which needs a table that
    feature_major_rows allows.
    """
    S = layout.sparse_cores_per_replica
    if order != SPARSE_CORE_MAJOR and feature_major_rows(layout, stacked) is None:
        raise ValueError(f"stacked table '{stacked.name}': its gradients cannot be given "
                         f"{order} (see feature_major_rows)")
    parts = []
    for feature in stacked.features:
        grad = gradients_by_path[feature.path]
        if grad is None:
            logging.warning("No gradient for feature '%s': applying a zero gradient to its rows "
                            "(this still updates optimizer state such as Adam's moments).",
                            feature.path)
            grad = tf.zeros([feature.sample_count, feature.table.dim], tf.float32)
        expected = tf.TensorShape(list(feature.output_shape) + [feature.table.dim])
        if not tf.TensorShape(grad.shape).is_compatible_with(expected):
            raise ValueError(f"feature '{feature.path}': gradient has shape {grad.shape}, "
                             f"expected {expected} (the shape of its activations)")
        grad = tf.reshape(tf.cast(grad, tf.float32), [feature.sample_count, feature.table.dim])
        if order != SPARSE_CORE_MAJOR:
            parts.append(grad)
            continue
        if feature.table.dim != stacked.padded_width:
            grad = tf.pad(grad, [[0, 0], [0, stacked.padded_width - feature.table.dim]])
        parts.append(tf.reshape(grad, [S, feature.sample_count // S, stacked.padded_width]))
    if order == PER_FEATURE:
        return parts
    if order == FEATURE_MAJOR:
        return tf.concat(parts, axis=0)
    return tf.reshape(tf.concat(parts, axis=1), [stacked.sample_count, stacked.padded_width])
