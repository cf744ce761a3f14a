"""All-to-all buffers of the exchange (docs/multi_worker.md#exchange): W equal chunks, chunk d
holding every table's entries for replica d, table after table, then zero padding.

One copy each way (cc/core/replica_chunks.h) instead of TensorFlow's W x T splits and
concatenations. Sizes and counts are checked before anything is allocated; a bad one fails with
InvalidArgument.
"""
import tensorflow as tf

from tf_sc_embedding._library import library as _lib


def pack_replica_chunks(values, counts, chunk, label="", name=None):
    """[W * chunk] buffer: chunk d holds counts[d, t] entries of values[t] for every t in turn.

    values: per table [n_t] (ids) or [n_t, width_t] (rows), each sorted by replica, all int32 or
    all float32; counts: int32 [W, T] (column t adds up to n_t); chunk: elements per replica
    (at least every row of counts times the widths).
    """
    return _lib.sce_pack_replica_chunks(values=list(values), counts=counts,
                                        chunk=tf.cast(chunk, tf.int32), label=label, name=name)


def pack_gathered_replica_chunks(params, indices, counts, chunk, label="", name=None):
    """pack_replica_chunks of the rows params[t][indices[t]], gathered while packing (no
    intermediate copy). params: per table [rows_t, width_t]; indices: per table int32 [n_t]
    (an index outside params[t] fails with InvalidArgument)."""
    return _lib.sce_pack_gathered_replica_chunks(
        params=list(params), indices=list(indices), counts=counts,
        chunk=tf.cast(chunk, tf.int32), label=label, name=name)


def unpack_replica_chunks(buffer, counts, widths, label="", row_multiples=None, name=None):
    """The inverse of pack_replica_chunks: per table, the entries of every chunk in chunk order.

    widths: per table, None for ids (the result is [n_t]) or the row width ([n_t, width]); all
    None or all given. The chunk size is the buffer's size / W. row_multiples (per table, or
    None): table t's result is padded with zero entries to a multiple of row_multiples[t].
    """
    flat = all(w is None for w in widths)
    if not flat and any(w is None for w in widths):
        raise ValueError(f"unpack_replica_chunks: widths must be all None or all set, got {widths}")
    return _lib.sce_unpack_replica_chunks(buffer=buffer, counts=counts, N=len(widths),
                                          widths=[1 if flat else int(w) for w in widths],
                                          flat=flat, row_multiples=list(row_multiples or []),
                                          label=label, name=name)
