"""`pipeline_execution_with_tensor_core=True`: the tables' update runs one step late, overlapping
the next step's dense work (docs/pipelining.md).

TensorFlow's meaning on SparseCore: the embedding work of a step overlaps the dense (TensorCore)
work, so activations are computed from tables one update behind. Here a step's fused update is
deferred: `apply_gradients` of step N computes the update's inputs (gradient exchange included)
and keeps them in per-replica variables (`UpdateStash`) instead of running the optimizer. Step
N+1 runs the kept update right after its own lookup has read the tables: the update does not
depend on step N+1's gradients, so TensorFlow's executor runs it while the dense model computes.
Step N+1's activations therefore miss exactly step N's update (one-step staleness), and every
update is applied exactly once, in order.

The kept inputs are those of the replica's own fused update (after the exchange), so running
them needs no collective: `TPUEmbeddingV2.apply_pending_gradients()` (flush) works anywhere, and
every read of the tables (logical tables, checkpoints, serving export, Keras weights) flushes first.
"""
import tensorflow as tf

from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding import private_tf


def summaries_recording():
    """True / False when it is known at trace time whether summaries are recorded, else a bool
    tensor (e.g. `tf.summary.record_if(step % 100 == 0)`)."""
    recording = tf.summary.should_record_summaries()
    static = tf.get_static_value(recording)
    return recording if static is None else bool(static)


class UpdateStash:
    """Per local replica: the kept inputs of every stacked table's update, and a pending flag.

    Variables have no fixed shape (a step's CSR sizes vary) and live on the replica's device.
    """

    def __init__(self, keys, group):
        """keys: the stacked table names of the updates a replica runs per step."""
        self._keys = list(keys)
        self._pending, self._inputs = {}, {}
        with tf.init_scope():
            for replica_id, device in zip(group.local_replica_ids, group.local_devices):
                with tf.device(device):
                    self._pending[replica_id] = private_tf.plain_variable(
                        tf.constant(False), f"pipelined_update_pending_replica_{replica_id}")
                    self._inputs[replica_id] = {
                        key: fused_update.UpdateInputs(*[
                            private_tf.shapeless_variable(
                                tf.zeros([0] if name != "num_minibatches_per_physical_sparse_core"
                                         else [], dtype),
                                f"pipelined_{key}_{name}_replica_{replica_id}")
                            for name, dtype in fused_update.UPDATE_INPUT_DTYPES.items()])
                        for key in self._keys}

    def apply_pending(self, replica_id, targets, non_finite_gradients):
        """Runs the kept update of a replica if there is one, and clears it.

        targets: {key: fused_update.UpdateTarget}. Returns an int64 scalar: the counted rows
        the update skipped ("skip" mode), else 0; it is computed after the update has run.
        """
        pending = self._pending[replica_id]
        kept = self._inputs[replica_id]

        def run_kept():
            keys = list(targets)
            results = fused_update.run_all(
                targets, {k: fused_update.UpdateInputs(*[v.read_value() for v in kept[k]])
                          for k in keys}, non_finite_gradients)
            skipped = (fused_update.skipped_rows([targets[k] for k in keys], results)
                       if non_finite_gradients == "skip" else tf.constant(0, tf.int64))
            with tf.control_dependencies(results):
                cleared = pending.assign(False)
            with tf.control_dependencies([cleared]):
                return tf.identity(skipped)

        return tf.cond(pending.read_value(), run_kept, lambda: tf.constant(0, tf.int64))

    def keep(self, replica_id, inputs):
        """Keeps this step's update inputs ({key: UpdateInputs}) and marks them pending.

        Gradients given per feature are kept as one feature-major tensor, which the update reads
        with the same feature_rows_per_sc (docs/optimizers.md#gradient-order).
        """
        kept = self._inputs[replica_id]
        writes = [variable.assign(tf.concat(value, 0) if isinstance(value, list) else value)
                  for key, values in inputs.items()
                  for variable, value in zip(kept[key], values)]
        with tf.control_dependencies(writes):
            return self._pending[replica_id].assign(True)

    def discard(self):
        """Forgets every kept update (after a restore: they belonged to the old tables)."""
        with tf.init_scope():
            for pending in self._pending.values():
                pending.assign(False)
