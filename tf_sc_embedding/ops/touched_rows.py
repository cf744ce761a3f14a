"""The rows a fused update writes, marked in a uint8 flags variable (cc/ops/touched_rows_ops.cc).

Delta exports (docs/deltas.md) send the rows training changed since the previous delta. The op
walks the same CSR view as the fused update (cc/core/touched_rows.h), so "the rows a step
changed" has one definition, and marks them without switching the flags variable to TensorFlow's
copy-on-read mode (as its scatter ops would).
"""
import tensorflow as tf

from tf_sc_embedding._library import library as _lib

# The fused update's shard attributes that the marking op shares.
SHARD_ATTRIBUTES = ("num_sparsecores_per_device", "num_replica", "num_source_replicas",
                    "first_local_shard", "num_local_shards")


def activation_rows(activation_gradients):
    """The activation row count of an update's gradients (one tensor or one per feature)."""
    parts = (activation_gradients if isinstance(activation_gradients, (list, tuple))
             else [activation_gradients])
    return tf.add_n([tf.shape(p, out_type=tf.int64)[0] for p in parts])


def mark_touched_rows(flags, inputs, table_name, arguments, name=None):
    """flags[row] = 1 for each row of the table variable that the fused update of `inputs`
    (fused_update.UpdateInputs) writes. arguments: the update's static shard attributes (others
    are ignored). flags: a uint8 [table rows] variable."""
    shard = {k: v for k, v in arguments.items() if k in SHARD_ATTRIBUTES}
    return _lib.sce_mark_touched_rows(
        row_pointers=inputs.row_pointers, sorted_sample_ids=inputs.sorted_sample_ids,
        sorted_token_ids=inputs.sorted_token_ids, sorted_gains=inputs.sorted_gains,
        num_minibatches_per_physical_sparse_core=inputs.num_minibatches_per_physical_sparse_core,
        activation_rows=activation_rows(inputs.activation_gradients), flags=flags.handle,
        table_name=table_name, name=name, **shard)
