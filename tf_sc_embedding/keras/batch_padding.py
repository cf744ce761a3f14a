"""Padding a smaller batch of ids to the batch the tables were laid out for (EmbeddingLayer).

The layout fixes the per-replica batch; a smaller batch (the last one of `predict`) is padded with
empty samples and the padding's activations are sliced off again.
"""
import tensorflow as tf


def batch_size_of(feature):
    """Dynamic batch size (rows) of a dense, ragged or sparse feature tensor."""
    if isinstance(feature, tf.RaggedTensor):
        return feature.nrows(out_type=tf.int32)
    if isinstance(feature, tf.SparseTensor):
        return tf.cast(feature.dense_shape[0], tf.int32)
    return tf.shape(feature, out_type=tf.int32)[0]


def pad_to(feature, rows):
    """Pads a feature to exactly `rows` samples (empty samples; id 0 for dense features)."""
    if isinstance(feature, tf.RaggedTensor):
        splits = feature.row_splits
        extra = rows + 1 - tf.shape(splits, out_type=splits.dtype)[0]
        splits = tf.concat([splits, tf.fill(tf.reshape(extra, [1]), splits[-1])], axis=0)
        splits = tf.ensure_shape(splits, [rows + 1])
        return tf.RaggedTensor.from_row_splits(feature.values, splits, validate=False)
    if isinstance(feature, tf.SparseTensor):
        shape = tf.concat([tf.constant([rows], tf.int64), feature.dense_shape[1:]], axis=0)
        static = [rows] + feature.shape.as_list()[1:]
        return tf.SparseTensor(feature.indices, feature.values,
                               tf.ensure_shape(shape, [len(static)]))
    feature = tf.convert_to_tensor(feature)
    extra = rows - tf.shape(feature)[0]
    paddings = tf.concat([tf.reshape(extra, [1, 1]) * tf.constant([[0, 1]]),
                          tf.zeros([feature.shape.rank - 1, 2], tf.int32)], axis=0)
    padded = tf.pad(feature, paddings)
    return tf.ensure_shape(padded, [rows] + feature.shape.as_list()[1:])
