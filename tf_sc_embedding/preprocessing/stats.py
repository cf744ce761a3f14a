"""SparseCore partition statistics: what `SparseCoreEmbeddingConfig.max_ids_per_table` and
`max_unique_ids_per_table` must be for a workload.

* `compute_sparse_core_stats(...)` is TensorFlow's `TPUEmbeddingV2.compute_sparse_core_stats`
  (same arguments, same result): for one batch, per stacked table, the maximum over source
  SparseCores and target partitions of the ids and of the unique ids a partition receives.
* `RunningStats` measures the same on every `enqueue` of a `TPUEmbeddingV2` (from the counts
  of the minibatch-splits op, which enqueue runs anyway, or under the all-to-all exchange from
  the routing op, which counts them from its own sort) and keeps the running
  maxima, exposed as `TPUEmbeddingV2.sparse_core_stats` and
  `suggested_sparse_core_limits()`, and written as TensorBoard scalars when a default
  `tf.summary` writer is active:
  ``sparse_core/<stacked table>/max_ids_per_partition`` and ``.../max_unique_ids_per_partition``
  (this step's values), ``.../running_max_ids_per_partition`` and
  ``.../running_max_unique_ids_per_partition``.

Only the sharded tables are measured: tables the embedding replicates (small tables with several
replicas, `replication_threshold_bytes` / `table_placement`) have no partitions here; measure them
with `compute_sparse_core_stats` or place them "sharded" while tuning.

The statistics are those of the SparseCore layout the embedding uses (replicas as chips,
`sparse_cores_per_replica` SparseCores each), whatever exchange runs on CPU: they are what a TPU
job with the same topology needs, even where the CPU exchange (all-to-all) has no limits.
"""
import threading

import tensorflow as tf

from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding.tables import feature_shapes
from tf_sc_embedding import ops
from tf_sc_embedding import private_tf
from tf_sc_embedding.tables.layout import EmbeddingLayout, flat_feature_paths

MAX_IDS = "max_ids_per_partition"
MAX_UNIQUE_IDS = "max_unique_ids_per_partition"


def table_stats(layout, stacked_name, per_feature):
    """(max ids, max unique ids) per partition of one stacked table: int32 scalars.

    per_feature: [(FeaturePlacement, per-SparseCore (rows, cols, gains) lists)] of its features.
    """
    S = layout.sparse_cores_per_replica
    stacked = layout.stacked_tables[stacked_name]
    max_ids, max_unique = tf.constant(0, tf.int32), tf.constant(0, tf.int32)
    for i in range(S):
        ids, unique = ops.get_stats_from_list_of_sparse_core_coo_tensors(
            row_ids_list=[f[1][0][i] for f in per_feature],
            col_ids_list=[f[1][1][i] for f in per_feature],
            gains_list=[f[1][2][i] for f in per_feature],
            sample_count_list=[p.sample_count // S for p, _ in per_feature],
            col_offset_list=[p.table.col_offset for p, _ in per_feature],
            num_replica=layout.num_replicas, table_vocab_size=stacked.total_rows,
            feature_width=stacked.padded_width, num_sc_per_chip=S, table_name=stacked_name)
        max_ids = tf.maximum(max_ids, ids)
        max_unique = tf.maximum(max_unique, unique)
    return max_ids, max_unique


def compute_sparse_core_stats(features, feature_config, num_tpu_chips, num_sc_per_chip=4,
                              optimizer=None, sparse_core_embedding_config=None):
    """TensorFlow's `TPUEmbeddingV2.compute_sparse_core_stats` on CPU.

    Args:
      features: one chip's batch, with the structure of `feature_config` (dense, ragged or sparse
        id tensors).
      feature_config: nested `tf.tpu.experimental.embedding.FeatureConfig`s; a feature without
        `output_shape` takes its shape from its input (one sample per row, per id for dense ids).
      num_tpu_chips: the replicas (chips) of the TPU job.
      num_sc_per_chip: SparseCores per chip.
      optimizer: the default optimizer (stacking groups tables by optimizer).
      sparse_core_embedding_config: its stacking options are honoured.
    Returns:
      (max_ids, max_unique_ids): dicts stacked table name -> int32 scalar tensor, the maximum
      over source SparseCores and target partitions, for
      `SparseCoreEmbeddingConfig(max_ids_per_table=..., max_unique_ids_per_table=...)`.
    """
    paths = flat_feature_paths(feature_config)
    flat_configs = tf.nest.flatten(feature_config)
    flat = feature_shapes.flatten_like(feature_config, features, "features")
    shapes = {}
    for path, config, feature in zip(paths, flat_configs, flat):
        shapes[path] = (feature_shapes.configured_shape(path, config) if config.output_shape.rank
                        else feature_shapes.sample_shape(path, feature))
    if optimizer is None and any(c.table.optimizer is None for c in flat_configs):
        # TensorFlow stacks tables without an optimizer together; the optimizer does not change
        # the statistics, only which tables stack, so any single one will do.
        optimizer = tf.tpu.experimental.embedding.SGD(learning_rate=0.1)
    layout = EmbeddingLayout(feature_config, optimizer, int(num_tpu_chips), int(num_sc_per_chip),
                             shapes, sparse_core_embedding_config)
    lists = enqueue_lib.feature_coo_lists(layout, flat, [None] * len(flat))
    max_ids, max_unique = {}, {}
    for name, per_feature in lists.items():
        max_ids[name], max_unique[name] = table_stats(layout, name, per_feature)
    return max_ids, max_unique


def _scalar_metadata():
    # What tf.summary.scalar writes (TensorBoard's "scalars" plugin), without needing the
    # tensorboard package that tf.summary.scalar imports.
    from tensorflow.core.framework import summary_pb2  # pylint: disable=import-outside-toplevel
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata.SerializeToString()


def _scalar(tag, value, step):
    tf.summary.write(tag, tf.cast(value, tf.float32), step=step, metadata=_scalar_metadata())


def _in_dataset_function():
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if "Dataset" in getattr(graph, "name", ""):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


class RunningStats:
    """Running maxima of the partition statistics of an embedding's enqueued batches."""

    def __init__(self, layout):
        self.layout = layout
        self.names = sorted(layout.stacked_tables)
        with tf.init_scope(), tf.device("CPU:0"):
            # [table, (max ids, max unique ids)], updated with ResourceScatterMax (atomic across
            # the replicas of this process), and the number of measured batches.
            self.maxima = private_tf.plain_variable(
                tf.zeros([len(self.names), 2], tf.int32), "sparse_core_stats_maxima")
            self.batches = private_tf.plain_variable(tf.constant(0, tf.int64),
                                                     "sparse_core_stats_batches")
        self._lock = threading.Lock()

    def observe_maxima(self, maxima, summarize):
        """Updates the running maxima with one replica's batch, {stacked table: (max ids, max
        unique ids)} (the max_ids / max_uniques outputs of the minibatch-splits op, or the routing
        op's max_ids / max_unique_ids); returns the op."""
        if _in_dataset_function():
            return None
        return self._record(maxima, summarize)

    def _record(self, maxima, summarize):
        step_values = tf.stack([tf.stack([tf.cast(v, tf.int32) for v in maxima[name]])
                                for name in self.names])
        with tf.device("CPU:0"):
            update = tf.raw_ops.ResourceScatterMax(
                resource=self.maxima.handle, indices=tf.range(len(self.names)),
                updates=step_values)
            with tf.control_dependencies([update]):
                count = self.batches.assign_add(1)
        if summarize:
            self._summaries(step_values, count)
        return count

    def _summaries(self, step_values, count):
        step = tf.summary.experimental.get_step()
        if step is None:
            step = count
        with tf.device("CPU:0"), tf.control_dependencies([count]):
            running = self.maxima.read_value()
            for t, name in enumerate(self.names):
                for j, key in enumerate((MAX_IDS, MAX_UNIQUE_IDS)):
                    _scalar(f"sparse_core/{name}/{key}", step_values[t, j], step)
                    _scalar(f"sparse_core/{name}/running_{key}", running[t, j], step)

    def read(self):
        """{stacked table: {"max_ids_per_partition": int, "max_unique_ids_per_partition": int,
        "batches": int}} (this process's batches)."""
        values = self.maxima.numpy()
        batches = int(self.batches.numpy())
        return {name: {MAX_IDS: int(values[t, 0]), MAX_UNIQUE_IDS: int(values[t, 1]),
                       "batches": batches}
                for t, name in enumerate(self.names)}


def suggested_limits(measured):
    """(max_ids_per_table, max_unique_ids_per_table) for `SparseCoreEmbeddingConfig` of a job
    with this topology, from running maxima ({stacked table: RunningStats.read() entry})."""
    return ({n: v[MAX_IDS] for n, v in measured.items()},
            {n: v[MAX_UNIQUE_IDS] for n, v in measured.items()})
