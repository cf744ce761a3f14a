"""One fused optimizer update of one stacked table on one replica: its inputs and how it runs.

Every exchange ends its backward pass the same way: the replica holds, for each stacked table, a
CSR over the rows it owns and the gradient rows that CSR points into, and runs the table's fused
optimizer op on its own variables. The exchanges differ only in how those inputs are computed and
in the static shard arguments. Splitting an update into

  * `UpdateTarget`: what to update and how (the stacked table, the shard arguments, the
    variables): known from the layout and the replica id alone, before any gradient exists;
  * `UpdateInputs`: the tensors of one step (CSR buffers and gradient rows),

lets an update run now (`run`) or later: pipelining (pipelining.py) keeps a step's inputs and
runs them against the same target one step later.
"""
import collections

import tensorflow as tf

# The tensors one update consumes, named as the fused update ops' inputs, with their dtypes.
UPDATE_INPUT_DTYPES = collections.OrderedDict([
    ("row_pointers", tf.int32),
    ("sorted_sample_ids", tf.int32),
    ("sorted_token_ids", tf.int32),
    ("sorted_gains", tf.float32),
    ("activation_gradients", tf.float32),
    ("num_minibatches_per_physical_sparse_core", tf.int32),
])
# activation_gradients may also be a list of per-feature tensors when the target's arguments carry
# feature_rows_per_sc (docs/optimizers.md#gradient-order).
UpdateInputs = collections.namedtuple("UpdateInputs", list(UPDATE_INPUT_DTYPES))

# stacked: layout.StackedTable; arguments: the op's static shard attributes; parameters and
# slots: this replica's variables of the stacked table (slots in the optimizer's order);
# counted: whether rows this update skips count into this replica's skipped-rows counter (a
# replicated table's rows are skipped alike on every replica and counted once).
UpdateTarget = collections.namedtuple(
    "UpdateTarget", ["stacked", "arguments", "parameters", "slots", "counted"])


def run(target, inputs, non_finite_gradients="error"):
    """Runs the fused update; returns the op, or with "skip" the number of rows left unchanged."""
    stacked = target.stacked
    return stacked.optimizer.apply(
        **inputs._asdict(), embedding_table=target.parameters, table_name=stacked.name,
        non_finite_gradients=non_finite_gradients,
        return_num_skipped_rows=non_finite_gradients == "skip",
        **dict(zip(stacked.optimizer.slot_inputs, target.slots)), **target.arguments)


def skipped_rows(targets, results):
    """The int64 sum of the counted targets' skipped rows ("skip" mode results)."""
    counts = [tf.cast(r, tf.int64) for t, r in zip(targets, results) if t.counted]
    return tf.add_n(counts) if counts else tf.constant(0, tf.int64)
