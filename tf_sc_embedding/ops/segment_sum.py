"""Weighted gather + segment sum: `out[segment_ids[i]] += gains[i] * rows[positions[i]]`.

The combine step of the all-to-all exchange (docs/multi_worker.md#exchange), in both directions:
forward it turns the unique rows a replica received into activations, backward it reduces
activation gradients to one row per unique id. It replaces TensorFlow's gather, multiply and
`unsorted_segment_sum` (an [ids, width] intermediate and a single-threaded scatter) with one
parallel kernel whose result is bit-identical to those three ops (cc/core/gathered_segment_sum.h).
"""
import tensorflow as tf

from tf_sc_embedding._library import library as _lib


def gathered_segment_sum(rows, positions, gains, segment_ids, num_segments, table_name="",
                         name=None):
    """float32 [num_segments, width]: row s is the sum of gains[i] * rows[positions[i]] over the
    entries i with segment_ids[i] == s, in entry order (zero where no entry points).

    rows: [num_rows, width] float32; positions, segment_ids: [n] int32; gains: [n] float32.
    Out-of-range positions or segment ids fail with InvalidArgument (naming `table_name`).
    Differentiable with respect to rows and gains.
    """
    return _lib.sce_gathered_segment_sum(
        rows=rows, positions=positions, gains=gains, segment_ids=segment_ids,
        num_segments=tf.cast(num_segments, tf.int32), table_name=table_name, name=name)


def _attr(op, name):
    value = op.get_attr(name)
    return value.decode() if isinstance(value, bytes) else value


@tf.RegisterGradient("SceGatheredSegmentSum")
def _gathered_segment_sum_grad(op, grad):
    """d rows: the transpose, i.e. the same op with positions and segment ids swapped;
    d gains[i]: <rows[positions[i]], grad[segment_ids[i]]>."""
    rows, positions, gains, segment_ids, _ = op.inputs
    table_name = _attr(op, "table_name")
    d_rows = gathered_segment_sum(grad, segment_ids, gains, positions, tf.shape(rows)[0],
                                  table_name=table_name)
    d_gains = tf.reduce_sum(tf.gather(rows, positions) * tf.gather(grad, segment_ids), axis=1)
    return [d_rows, None, d_gains, None, None]


def gathered_segment_sum_to_features(rows, positions, gains, segment_ids, sparse_cores,
                                     feature_rows_per_sc, row_indices=None, table_name="",
                                     name=None):
    """gathered_segment_sum into one activation matrix per feature, with no split afterwards.

    segment_ids are stacked rows s * M + start_f + k (M = sum(feature_rows_per_sc), feature f at
    offset start_f of each SparseCore's M rows); that row is row s * feature_rows_per_sc[f] + k of
    feature f's [sparse_cores * feature_rows_per_sc[f], width] result
    (docs/lookup.md#activation-row-order). With row_indices (int32 [u], each in [0, rows)),
    position p stands for rows[row_indices[p]], read in place: the same result as gathering
    those rows first, without the gathered copy. Differentiable with respect to rows and gains.
    """
    return _lib.sce_gathered_segment_sum_to_features(
        rows=rows, positions=positions, gains=gains, segment_ids=segment_ids,
        row_indices=[] if row_indices is None else [row_indices],
        N=len(feature_rows_per_sc), sparse_cores=sparse_cores,
        feature_rows_per_sc=list(feature_rows_per_sc),
        table_name=table_name, name=name)


def gathered_segment_sum_from_features(gradients, positions, gains, segment_ids, num_segments,
                                       sparse_cores, feature_rows_per_sc, table_name="",
                                       name=None):
    """gathered_segment_sum whose rows are the per-feature matrices `gradients` (positions are
    stacked rows, numbered as in gathered_segment_sum_to_features), read in place instead of
    concatenated first."""
    return _lib.sce_gathered_segment_sum_from_features(
        gradients=list(gradients), positions=positions, gains=gains, segment_ids=segment_ids,
        num_segments=tf.cast(num_segments, tf.int32), sparse_cores=sparse_cores,
        feature_rows_per_sc=list(feature_rows_per_sc), table_name=table_name, name=name)


@tf.RegisterGradient("SceGatheredSegmentSumToFeatures")
def _to_features_grad(op, *grads):
    """d rows: the per-feature gradients summed back per row (the FromFeatures op; with row
    indices, per index, then as IndexedSlices of rows); d gains[i]: <rows[positions[i]], grad of
    entry i's activation row>."""
    rows, positions, gains, segment_ids = op.inputs[:4]
    indices = op.inputs[4] if len(op.inputs) > 4 else None
    cores, per_sc = _attr(op, "sparse_cores"), list(_attr(op, "feature_rows_per_sc"))
    grads = [tf.zeros_like(out) if g is None else g for g, out in zip(grads, op.outputs)]
    num_read = tf.shape(rows)[0] if indices is None else tf.size(indices)
    d_read = gathered_segment_sum_from_features(
        grads, segment_ids, gains, positions, num_read, cores, per_sc,
        table_name=_attr(op, "table_name"))
    if indices is None:
        d_rows = d_read
    else:
        d_rows = tf.IndexedSlices(d_read, indices, tf.shape(rows))
        rows = tf.gather(rows, indices)
    width = tf.shape(rows)[1]
    stacked = tf.reshape(tf.concat([tf.reshape(g, [cores, p, width])
                                    for g, p in zip(grads, per_sc)], axis=1),
                         [cores * sum(per_sc), width])
    d_gains = tf.reduce_sum(tf.gather(rows, positions) * tf.gather(stacked, segment_ids), axis=1)
    return [d_rows, None, d_gains, None] + [None] * (len(op.inputs) - 4)
