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


@tf.RegisterGradient("SceGatheredSegmentSum")
def _gathered_segment_sum_grad(op, grad):
    """d rows: the transpose, i.e. the same op with positions and segment ids swapped;
    d gains[i]: <rows[positions[i]], grad[segment_ids[i]]>."""
    rows, positions, gains, segment_ids, _ = op.inputs
    table_name = op.get_attr("table_name")
    if isinstance(table_name, bytes):
        table_name = table_name.decode()
    d_rows = gathered_segment_sum(grad, segment_ids, gains, positions, tf.shape(rows)[0],
                                  table_name=table_name)
    d_gains = tf.reduce_sum(tf.gather(rows, positions) * tf.gather(grad, segment_ids), axis=1)
    return [d_rows, None, d_gains, None, None]
