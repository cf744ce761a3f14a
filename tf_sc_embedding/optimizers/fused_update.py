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
import hashlib

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
# step_counter: the replica's count of updates applied (collectives.UPDATE_STEPS), whose value is
# the step that rounds 16-bit rows.
# touched: None, or the replica's uint8 flags of the stacked table's rows, which the update
# marks (delta tracking, deltas/tracking.py).
UpdateTarget = collections.namedtuple(
    "UpdateTarget", ["stacked", "arguments", "parameters", "slots", "counted", "step_counter",
                     "touched"], defaults=[None])


def rounding_arguments(stacked):
    """The op's rounding attributes of a stacked table with 16-bit rows: per member table (in
    row-offset order) its row offset, rotation and seed, which give every row its logical id and
    its random bits (cc/core/row_precision.h). Empty for float32 tables."""
    if stacked.dtype == "float32":
        return {}
    return dict(
        rounding_row_offsets=[t.layout.sparse_core_shard_row_offset for t in stacked.tables],
        rounding_rotations=[t.layout.sparse_core_shard_rotation for t in stacked.tables],
        rounding_seeds=[table_seed(t.name) for t in stacked.tables], rounding=stacked.rounding)


def table_seed(table_name):
    """A table's rounding seed: a fixed function of its name (so any topology agrees)."""
    digest = hashlib.sha256(table_name.encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def run(target, inputs, non_finite_gradients="error", step=None):
    """Runs the fused update; returns the op, or with "skip" the number of rows left unchanged.
    `step` (int64 scalar): the rounding step of 16-bit rows."""
    stacked = target.stacked
    rounding = rounding_arguments(stacked)
    if rounding:
        rounding["rounding_step"] = target.step_counter.read_value() if step is None else step
    if target.touched is not None:   # delta tracking: the update marks the rows it writes
        rounding["touched_flags"] = target.touched
    return stacked.optimizer.apply(
        **inputs._asdict(), embedding_table=target.parameters, table_name=stacked.name,
        non_finite_gradients=non_finite_gradients,
        return_num_skipped_rows=non_finite_gradients == "skip",
        **dict(zip(stacked.optimizer.slot_inputs, target.slots)), **target.arguments, **rounding)


def run_all(targets, inputs, non_finite_gradients="error"):
    """Runs one replica's updates ({key: target}, {key: inputs}) as one step: all round with the
    same step, which then advances. Returns the results, in the order of `targets`."""
    keys = list(targets)
    # Only 16-bit tables round with the step, which then advances after their updates; with
    # delta tracking (a delta records its step) the step is only counted, and nothing waits for
    # the count. Float32-only embeddings without tracking neither read nor advance it.
    narrow = any(rounding_arguments(targets[k].stacked) for k in keys)
    counted = narrow or any(targets[k].touched is not None for k in keys)
    counter = targets[keys[0]].step_counter if keys and counted else None
    step = counter.read_value() if narrow else None
    results = [run(targets[k], inputs[k], non_finite_gradients, step) for k in keys]
    if narrow:
        with tf.control_dependencies([r for r in results if r is not None]):
            advanced = counter.assign_add(1)
        with tf.control_dependencies([advanced]):
            results = [tf.identity(r) if isinstance(r, tf.Tensor) else r for r in results]
    elif counter is not None:
        counter.assign_add(1)
    return results


def skipped_rows(targets, results):
    """The int64 sum of the counted targets' skipped rows ("skip" mode results)."""
    counts = [tf.cast(r, tf.int64) for t, r in zip(targets, results) if t.counted]
    return tf.add_n(counts) if counts else tf.constant(0, tf.int64)
