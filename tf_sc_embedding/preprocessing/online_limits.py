"""Online adaptation of the SparseCore partition limits (docs/preprocessing.md#online-limits).

With `TPUEmbeddingV2(..., adapt_sparse_core_limits=True)` each stacked table of the sharded
layout keeps two limits, max ids and max unique ids per partition, starting at the values of
`SparseCoreEmbeddingConfig` (TensorFlow's TPU default of 256 where none is set). Every `dequeue`
agrees the running partition statistics (`tf_sc_embedding.preprocessing.stats.RunningStats`) over all replicas
and workers with one small all-gather, and raises each limit that the agreed maximum exceeds to
that maximum: every replica holds the same limits, every raise is logged (one warning per process
naming the table, the limit and its old and new values), and `TPUEmbeddingV2.sparse_core_limits`
returns them, ready for a TPU job's `SparseCoreEmbeddingConfig`.

Since a batch's limits are raised to cover it, a step with adaptation never minibatches or fails
because of the partition limits: the preprocessing runs unlimited, which gives the same result
as running with the raised limits.
"""
import tensorflow as tf

from tf_sc_embedding import private_tf
from tf_sc_embedding.ops.online_limits import raise_sparse_core_limits
from tf_sc_embedding.preprocessing.stats import MAX_IDS, MAX_UNIQUE_IDS

# TensorFlow's TPUEmbeddingV2 uses this for both limits of a table without a configured value.
TPU_DEFAULT_LIMIT = 256


def initial_limits(stacked_names, sparse_core_config):
    """[[max ids, max unique ids]] per stacked table: the configured values or TPU_DEFAULT_LIMIT."""
    max_ids = getattr(sparse_core_config, "max_ids_per_table", None) or {}
    max_uniques = getattr(sparse_core_config, "max_unique_ids_per_table", None) or {}
    return [[int(max_ids.get(n, TPU_DEFAULT_LIMIT)), int(max_uniques.get(n, TPU_DEFAULT_LIMIT))]
            for n in stacked_names]


class OnlineLimits:
    """The limits of one process (one variable, shared by its replicas), raised at every step."""

    def __init__(self, stats, sparse_core_config):
        self._stats = stats
        self.names = stats.names   # the row order of the statistics
        with tf.init_scope(), tf.device("CPU:0"):
            self.variable = private_tf.plain_variable(
                tf.constant(initial_limits(self.names, sparse_core_config), tf.int32),
                "sparse_core_limits")

    def update(self, view):
        """Agrees the running statistics over all replicas and raises the limits; returns the op.

        Every replica of the process calls it with the same agreed values: the first raises and
        logs, the others find nothing to raise.
        """
        maxima = self._stats.maxima.read_value()
        agreed = tf.reshape(view.all_max(tf.reshape(maxima, [-1])), tf.shape(maxima))
        return raise_sparse_core_limits(self.variable, agreed, self.names)

    def read(self):
        """{stacked table: {"max_ids_per_partition": int, "max_unique_ids_per_partition": int}}."""
        values = self.variable.numpy()
        return {name: {MAX_IDS: int(values[t, 0]), MAX_UNIQUE_IDS: int(values[t, 1])}
                for t, name in enumerate(self.names)}
