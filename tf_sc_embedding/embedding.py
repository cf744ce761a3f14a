"""`TPUEmbeddingV2`: TensorFlow's SparseCore embedding programming model, running on CPU.

Construct it (under a `tf.distribute` strategy scope or without one) from TensorFlow's own
`tf.tpu.experimental.embedding` configs, then per step: `enqueue` (host preprocessing) and
`dequeue` (lookup), or `embedding_lookup` / `__call__` for both, and `apply_gradients` with the
gradients of the activations. Tables are built on first use (or by `build`) because the layout
depends on the per-replica batch size.
"""
import collections
import contextlib
import dataclasses
import threading

import tensorflow as tf
from absl import logging

from tf_sc_embedding import checkpointing
from tf_sc_embedding import collectives
from tf_sc_embedding import enqueue as enqueue_lib
from tf_sc_embedding import fused_update
from tf_sc_embedding import online_limits as online_limits_lib
from tf_sc_embedding import pipelining
from tf_sc_embedding import private_tf
from tf_sc_embedding import stats as stats_lib
from tf_sc_embedding import exchange as all_to_all_exchange
from tf_sc_embedding import sharded_lookup as all_gather_exchange
from tf_sc_embedding.ops import gradient_check
from tf_sc_embedding.layout import (DEFAULT_SPARSE_CORES_PER_REPLICA, REPLICATED, SHARDED,
                                    EmbeddingPlan, flat_feature_paths, table_names)
from tf_sc_embedding.table_storage import (PARAMETERS, PendingRestore, TableStorage,
                                           as_tensor_zero_copy)

EXCHANGES = ("auto", "all_to_all", "all_gather")
NON_FINITE_GRADIENTS = ("error", "skip")
# With several replicas, tables with at most this many bytes of parameters are held whole by every
# replica (data parallel, updated with a sparse allreduce) instead of being sharded.
DEFAULT_REPLICATION_THRESHOLD_BYTES = 256 * 1024

# What dequeue returns for apply_gradients: the sharded tables' and the replicated tables' state.
Preserved = collections.namedtuple("Preserved", ["sharded", "replicated"])


def _choose_exchange(exchange, num_replicas, sparse_core_config):
    if num_replicas == 1:
        return "single"
    if exchange != "auto":
        return exchange
    limits = sparse_core_config is not None and (
        sparse_core_config.max_ids_per_table or sparse_core_config.max_unique_ids_per_table or
        sparse_core_config.allow_id_dropping)
    if limits:
        # Worth a line in the log: all-gather sends bytes that grow with the replica count.
        logging.info("tf_sc_embedding: exchange='auto' picked 'all_gather' over %d replicas: "
                     "SparseCoreEmbeddingConfig sets per-partition limits (max_ids_per_table, "
                     "max_unique_ids_per_table or allow_id_dropping), which only that exchange "
                     "implements. Without them it would pick 'all_to_all'; see "
                     "docs/multi_worker.md#exchange.", num_replicas)
        return "all_gather"
    return "all_to_all"


def _has_distributed_values(*structures):
    return any(isinstance(v, tf.distribute.DistributedValues)
               for structure in structures if structure is not None
               for v in ([structure] if isinstance(structure, tf.distribute.DistributedValues)
                         else tf.nest.flatten(structure)))


class TPUEmbeddingV2(tf.Module):
    """Sharded embedding tables with fused optimizers; see the module docstring.

    pipeline_execution_with_tensor_core: TensorFlow's meaning on CPU (docs/pipelining.md): each
      step's fused update runs during the next step, after that step's lookup, overlapping its
      dense work; activations are one update stale. Sequential while summaries are recorded.
      `apply_pending_gradients` applies the last kept update; reads of the tables do it first.

    Extra constructor arguments (not in TensorFlow's signature):
      sparse_cores_per_replica: SparseCores per replica (the shards of every table per replica).
      exchange: how replicas exchange ids and rows: "all_to_all" (ids to the owner of their
        shard, rows back; bytes per replica do not grow with the number of replicas), or
        "all_gather" (every replica sees every replica's ids and sums partial activations; it
        implements SparseCore's per-partition limits: minibatching and id dropping). "auto" is
        "all_gather" when `sparse_core_embedding_config` sets per-table limits or id dropping,
        else "all_to_all" (which has no partition buffers to limit).
      collective_timeout_seconds: fail a step whose collective waits longer than this (e.g. a
        worker died); 0 waits forever (MultiWorkerMirroredStrategy's health checks still abort).
      replication_threshold_bytes: with several replicas, tables whose parameters take at most
        this many bytes (vocabulary_size x dim x 4) are replicated: every replica holds the whole
        table, looks it up locally and applies the same update after a sparse allreduce of the
        touched rows. 0 shards every table.
      table_placement: {table name (or TableConfig): "sharded" | "replicated"}, overriding the
        threshold.
      track_sparse_core_stats: measure every enqueued batch's SparseCore partition statistics
        of the sharded tables (`sparse_core_stats`, TensorBoard summaries; see
        tf_sc_embedding/stats.py).
      non_finite_gradients: what `apply_gradients` does when the gradient of a feature's
        activations has a NaN or Inf on any replica (docs/optimizers.md#non-finite-gradients).
        "error" (default): the step fails with InvalidArgumentError naming every such feature
        and its table, on every replica, before any table or slot is written. "skip": rows whose
        gradient is not finite are left unchanged (with their slots), the others are updated,
        and the skipped rows are counted (`num_skipped_gradient_rows`).
      adapt_sparse_core_limits: raise each sharded stacked table's partition limits (max ids and
        max unique ids per partition) online to the running statistics agreed over all replicas
        and workers, logging every raise (`sparse_core_limits`; tf_sc_embedding/online_limits.py).
        Needs track_sparse_core_stats.
    """

    def __init__(self, feature_config, optimizer=None, pipeline_execution_with_tensor_core=False,
                 sparse_core_embedding_config=None,
                 sparse_cores_per_replica=DEFAULT_SPARSE_CORES_PER_REPLICA, exchange="auto",
                 collective_timeout_seconds=collectives.DEFAULT_TIMEOUT_SECONDS,
                 replication_threshold_bytes=DEFAULT_REPLICATION_THRESHOLD_BYTES,
                 table_placement=None, track_sparse_core_stats=True,
                 non_finite_gradients="error", adapt_sparse_core_limits=False):
        super().__init__(name="tpu_embedding_v2")
        if adapt_sparse_core_limits and not track_sparse_core_stats:
            raise ValueError("adapt_sparse_core_limits needs track_sparse_core_stats=True (the "
                             "limits are raised to the measured statistics)")
        self._adapt_limits = bool(adapt_sparse_core_limits)
        self._online_limits = None
        if non_finite_gradients not in NON_FINITE_GRADIENTS:
            raise ValueError(f"non_finite_gradients must be one of {NON_FINITE_GRADIENTS}, got "
                             f"{non_finite_gradients!r}")
        self._non_finite_gradients = non_finite_gradients
        self._track_stats = bool(track_sparse_core_stats)
        self._stats = None
        if exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
        self._feature_config = feature_config
        self._optimizer = optimizer
        self._pipelining = bool(pipeline_execution_with_tensor_core)
        self._stash = None
        self._sparse_core_config = sparse_core_embedding_config
        self._sparse_cores = sparse_cores_per_replica
        self._strategy = tf.distribute.get_strategy()
        self._group = collectives.ReplicaGroup(self._strategy, collective_timeout_seconds)
        self._num_replicas = self._group.num_replicas
        self._exchange = _choose_exchange(exchange, self._num_replicas,
                                          sparse_core_embedding_config)
        self._build_lock = threading.Lock()
        self._plan = None
        self._storage = None
        self._flat_paths = flat_feature_paths(feature_config)
        self._replicated = _replicated_tables(feature_config, replication_threshold_bytes,
                                              table_placement or {})
        # Fail fast on bad configs (optimizers, combiners, names) before any input is seen.
        config_layout = self._check_config()
        # Checkpoint nodes, one per user table, named by table (see checkpointing.py). They exist
        # before build() so that a checkpoint restored early is consumed by build().
        self._pending_restore = PendingRestore()
        self._logical_nodes = {
            t.name: checkpointing.LogicalTable(self, t.name, t.config, t.optimizer.slot_names)
            for s in config_layout.stacked_tables.values() for t in s.tables}

    # ----------------------------------------------------------------------------- building
    def _check_config(self):
        shapes = {p: (self._sparse_cores,) for p in self._flat_paths}
        return self._make_plan(shapes)

    def _make_plan(self, shapes):
        config = self._sparse_core_config
        if self._adapt_limits and config is not None:
            # Limits raised to cover every batch never split one into minibatches: preprocess
            # without limits (the same result); the configured values start the online limits.
            config = dataclasses.replace(config, max_ids_per_table=None,
                                         max_unique_ids_per_table=None)
        return EmbeddingPlan(self._feature_config, self._optimizer, self._num_replicas,
                             self._sparse_cores, shapes, config, replicated=self._replicated)

    def build(self, per_replica_batch_size=None, output_shapes=None):
        """Lays out and creates the tables for a per-replica batch size (or per-feature shapes)."""
        with self._build_lock:
            if self._plan is not None:
                return
            shapes = {}
            flat_features = tf.nest.flatten(self._feature_config)
            given = (private_tf.flatten_up_to(self._feature_config, output_shapes)
                     if output_shapes is not None else [None] * len(flat_features))
            for path, feature, shape in zip(self._flat_paths, flat_features, given):
                if shape is None and feature.output_shape.rank:
                    shape = feature.output_shape.as_list()
                if shape is None:
                    if per_replica_batch_size is None:
                        raise ValueError(f"feature '{path}': no output_shape in its FeatureConfig; "
                                         "pass per_replica_batch_size to build()")
                    shape = [per_replica_batch_size]
                shape = tuple(int(d) for d in shape)
                count = 1
                for d in shape:
                    count *= d
                if count % self._sparse_cores:
                    raise ValueError(
                        f"feature '{path}': the per-replica batch ({count} samples) must be "
                        f"divisible by the SparseCores per replica ({self._sparse_cores}); the "
                        f"global batch must be divisible by replicas x SparseCores "
                        f"({self._num_replicas} x {self._sparse_cores})")
                shapes[path] = shape
            plan = self._make_plan(shapes)
            storage = TableStorage(plan, self._group)
            storage.create(self._pending_restore.reader)
            self._group.create_variables()
            self._storage = storage
            self._plan = plan
            if self._pipelining:
                self._stash = pipelining.UpdateStash(self._update_targets(
                    self._group.local_replica_ids[0]), self._group)
            if self._track_stats and plan.sharded is not None:
                self._stats = stats_lib.RunningStats(plan.sharded)
                if self._adapt_limits:
                    self._online_limits = online_limits_lib.OnlineLimits(
                        self._stats, self._sparse_core_config)
            self._pending_restore.clear()

    def _output_shapes_of(self, flat_features):
        shapes = []
        for path, feature in zip(self._flat_paths, flat_features):
            if isinstance(feature, (tf.RaggedTensor, tf.SparseTensor)):
                batch = feature.shape[0]
                shape = None if batch is None else [batch]
            else:
                shape = tf.convert_to_tensor(feature).shape.as_list()
                shape = None if None in shape else shape
            if shape is None:
                raise ValueError(f"feature '{path}': the batch size must be static to build the "
                                 "tables; call build(per_replica_batch_size=...) first")
            shapes.append(shape)
        return tf.nest.pack_sequence_as(self._feature_config, shapes)

    @property
    def built(self):
        return self._plan is not None

    # ----------------------------------------------------------------------------- properties
    @property
    def feature_paths(self):
        """The joined string paths of the features, in `tf.nest.flatten` order."""
        return list(self._flat_paths)

    @property
    def feature_config(self):
        return self._feature_config

    @property
    def exchange(self):
        """"all_to_all", "all_gather" or "single" (one replica: no exchange)."""
        return self._exchange

    @property
    def replica_group(self):
        """The replicas (global ids of this process's replicas, devices, workers)."""
        return self._group

    @property
    def storage(self):
        """The `TableStorage` that owns the per-replica variables and the logical views."""
        self._require_built("storage")
        return self._storage

    def per_replica_feature_shapes(self):
        """Per flat feature, the per-replica shape of its samples (after build)."""
        self._require_built("per_replica_feature_shapes")
        return [tuple(p.output_shape) for p in self._plan.features]

    @property
    def table_shapes(self):
        """Table name -> (vocabulary_size, dim)."""
        return {name: node.logical_shape for name, node in self._logical_nodes.items()}

    def table_kinds(self, table_name):
        """("parameters", <slot names>...) of a table."""
        return self._logical_nodes[table_name].kinds

    @property
    def embedding_layouts(self):
        """Where every table lives: table name -> TableLayout (stacked name, offsets, rotation)."""
        self._require_built("embedding_layouts")
        return self._plan.table_layouts()

    @property
    def placement_plan(self):
        """Table name -> "sharded" (mod-sharded over all replicas) or "replicated" (whole on
        every replica; only with several replicas)."""
        replicated = self._replicated if self._num_replicas > 1 else frozenset()
        return {name: REPLICATED if name in replicated else SHARDED
                for name in self._logical_nodes}

    @property
    def variables(self):
        """Stacked table name -> {"parameters": ShardedTable, <slot>: ShardedTable} (local replicas)."""
        self._require_built("variables")
        return self._storage.stacked_variables()

    @property
    def embedding_tables(self):
        """The user's TableConfig -> its logical [vocabulary_size, dim] table (numpy array).

        With several worker processes this is a collective read: call it on every worker.
        """
        self._require_built("embedding_tables")
        self.apply_pending_gradients()
        return {self._storage.placement(name).config: self._storage.read_logical(name, PARAMETERS)
                for name in self._logical_nodes}

    @property
    def embedding_table_shards(self):
        """The user's TableConfig -> the variables of the stacked table on this process's replicas."""
        self._require_built("embedding_table_shards")
        variables = self._storage.stacked_variables()
        return {t.config: list(variables[name][PARAMETERS].shards)
                for name, s in self._plan.stacked_tables.items() for t in s.tables}

    def logical_slot(self, table_config, slot_name):
        """One optimizer slot of one user table, in the logical [vocabulary_size, dim] view."""
        self._require_built("logical_slot")
        self.apply_pending_gradients()
        for name in self._logical_nodes:
            if self._storage.placement(name).config is table_config:
                return self._storage.read_logical(name, slot_name)
        raise KeyError(f"unknown table {table_config}")

    def logical_tables(self, include_slots=False, as_numpy=True):
        """Table name -> logical [vocabulary_size, dim] table (numpy, or tf.Tensor if not as_numpy).

        With include_slots, table name -> {"parameters": ..., <slot name>: ...}. With several
        worker processes this is a collective read: call it on every worker.
        """
        self._require_built("logical_tables")
        result = {}
        for name, node in self._logical_nodes.items():
            kinds = node.kinds if include_slots else (PARAMETERS,)
            values = {}
            for kind in kinds:
                value = self.read_logical(name, kind)
                values[kind] = value if as_numpy else as_tensor_zero_copy(value)
            result[name] = values if include_slots else values[PARAMETERS]
        return result

    def read_logical(self, table_name, kind=PARAMETERS):
        """The logical value of one table's parameters or slot (numpy; a tensor in graphs)."""
        self._require_built("read_logical")
        self.apply_pending_gradients()
        if tf.executing_eagerly():
            return self._storage.read_logical(table_name, kind)
        return self._storage.read_logical_tf(table_name, kind)

    def restore_logical(self, values):
        """Writes logical tables now, or at build() if the embedding is not built yet.

        values: {table name: {kind: numpy array, or a reader (first_row, stop) -> rows}}. Every
        table's shapes must have been checked by the caller. A later call wins per table and kind.
        """
        with self._build_lock:
            if self._plan is None:
                self._pending_restore.add(values)
                return
        with tf.init_scope():
            if self._stash is not None:   # a kept update belongs to the tables being replaced
                self._stash.discard()
            for name, kinds in values.items():
                for kind, value in kinds.items():
                    self._storage.write_logical(name, kind, value)

    def pending_restore(self, table_name, kind):
        """A chunk reader (first, stop) -> rows of what a deferred restore holds for a table's
        parameters or slot, or None if it holds nothing."""
        return self._pending_restore.reader(table_name, kind)

    def num_skipped_gradient_rows(self):
        """Rows left unchanged since build because their gradient was not finite.

        Only counted with non_finite_gradients="skip". The total over this process's replicas:
        a sharded table's row counts on the replica that owns it, a replicated table's row once
        (on replica 0's process). Under MultiWorkerMirroredStrategy, sum the workers' values.
        """
        return sum(self._group.counter_values(collectives.SKIPPED_GRADIENT_ROWS).values())

    def collective_bytes_sent(self):
        """{local replica id: bytes sent through the embedding's collectives so far}."""
        return self._group.bytes_sent()

    def export_serving(self, export_dir, **kwargs):
        """Writes a SavedModel that looks features up with stock TensorFlow ops only.

        See `tf_sc_embedding.serving.export_serving` for the signatures.
        """
        from tf_sc_embedding import serving  # pylint: disable=import-outside-toplevel
        return serving.export_serving(self, export_dir, **kwargs)

    # ----------------------------------------------------------------------------- checkpoints
    # Saved by checkpointing's registered saver (one logical table at a time).
    _sce_checkpoint_writer = True

    def _trackable_children(self, save_type=None, **kwargs):
        # Only the per-table logical nodes (named as TensorFlow names its table and slot
        # variables): the per-replica variables depend on the topology and are never
        # checkpointed directly.
        return checkpointing.trackable_children(self._logical_nodes)

    def _lookup_dependency(self, name, cached_dependencies=None):
        node = checkpointing.lookup_dependency(self.__dict__.get("_logical_nodes", {}), name)
        return node if node is not None else super()._lookup_dependency(name, cached_dependencies)

    def logical_tables_for_checkpoint(self):
        """Table name -> checkpointing.LogicalTable."""
        return dict(self._logical_nodes)

    def _require_built(self, what):
        if self._plan is None:
            raise RuntimeError(f"{what} needs the tables: call build(), embedding_lookup() or "
                               "enqueue() first")

    # ----------------------------------------------------------------------------- steps
    def flatten_features(self, structure, what, allow_none=False):
        """tf.nest.flatten of a structure that must match feature_config (clear error if not)."""
        try:
            tf.nest.assert_same_structure(self._feature_config, structure)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{what} must have the same structure as feature_config: {e}") from None
        flat = tf.nest.flatten(structure)
        if not allow_none and any(x is None for x in flat):
            raise ValueError(f"{what} contains None")
        return flat

    _flatten = flatten_features

    def enqueue(self, features, weights=None, device=None):
        """Host preprocessing of one replica's batch; returns per stacked table sorted ids.

        Works eagerly, in `tf.function`, in replica context and inside `tf.data.Dataset.map`.
        `device`: where the preprocessing runs (TensorFlow: the host of that TPU device; here the
        device itself); by default the current device.

        In cross-replica context with per-replica inputs (e.g. `next(iter(distributed_dataset))`
        outside `strategy.run`), as TensorFlow's pattern: every local replica's batch is
        preprocessed, on `device` if given, else on that replica's device, and the result is a
        per-replica value; pass it to `strategy.run`, where `dequeue` takes each replica's part.
        """
        if _has_distributed_values(features, weights):
            return self._enqueue_per_replica(features, weights, device)
        return self._enqueue_one(features, weights, device)

    def _enqueue_one(self, features, weights, device, summarize=None):
        flat = self.flatten_features(features, "features")
        flat_weights = ([None] * len(flat) if weights is None else
                        self.flatten_features(weights, "weights", allow_none=True))
        if not self.built:
            self.build(output_shapes=self._output_shapes_of(flat))
        by_path = dict(zip(self._flat_paths, zip(flat, flat_weights)))
        result = {}
        with tf.device(device) if device else contextlib.nullcontext():
            for layout in self._plan.parts():
                ids = [by_path[f.path][0] for f in layout.features]
                weights_ = [by_path[f.path][1] for f in layout.features]
                splits = layout is self._plan.sharded and self._exchange != "all_to_all"
                observe = (self._stats_observer(summarize)
                           if layout is self._plan.sharded else None)
                result.update(enqueue_lib.preprocess(layout, ids, weights_, with_splits=splits,
                                                     observe_maxima=observe))
        return result

    def _enqueue_per_replica(self, features, weights, device):
        """Cross-replica enqueue of per-replica inputs -> per-replica preprocessed outputs."""
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            raise ValueError("per-replica (distributed) inputs are only accepted by enqueue in "
                             "cross-replica context (outside strategy.run); inside strategy.run "
                             "pass each replica's own tensors")
        if device is not None:
            tf.DeviceSpec.from_string(device)   # a malformed device string fails here
        strategy = self._strategy
        local_ids = list(self._group.local_replica_ids)
        count = len(local_ids)

        def per_replica(structure):
            if isinstance(structure, tf.distribute.DistributedValues):
                return list(strategy.experimental_local_results(structure))
            flat = tf.nest.flatten(structure)
            columns = []
            for value in flat:
                if isinstance(value, tf.distribute.DistributedValues):
                    value = list(strategy.experimental_local_results(value))
                    if len(value) != count:
                        raise ValueError(f"a per-replica input has {len(value)} values, this "
                                         f"process runs {count} replicas")
                    columns.append(value)
                else:
                    columns.append([value] * count)
            return [tf.nest.pack_sequence_as(structure, [c[i] for c in columns])
                    for i in range(count)]

        local_features = per_replica(features)
        local_weights = [None] * count if weights is None else per_replica(weights)
        outputs = []
        for i, replica_device in enumerate(self._group.local_devices):
            outputs.append(self._enqueue_one(local_features[i], local_weights[i],
                                             device or replica_device, summarize=i == 0))
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: outputs[local_ids.index(int(tf.get_static_value(
                ctx.replica_id_in_sync_group)))])

    # ----------------------------------------------------------------------------- statistics
    @classmethod
    def compute_sparse_core_stats(cls, features, feature_config, num_tpu_chips, num_sc_per_chip=4,
                                  optimizer=None, sparse_core_embedding_config=None):
        """TensorFlow's: (max ids, max unique ids) per partition, dicts by stacked table name."""
        return stats_lib.compute_sparse_core_stats(
            features, feature_config, num_tpu_chips, num_sc_per_chip=num_sc_per_chip,
            optimizer=optimizer, sparse_core_embedding_config=sparse_core_embedding_config)

    @property
    def sparse_core_stats(self):
        """Running maxima over the batches enqueued in this process, per stacked table:
        {"max_ids_per_partition", "max_unique_ids_per_partition", "batches"} (None when not
        tracked or not built)."""
        return None if self._stats is None else self._stats.read()

    @property
    def sparse_core_limits(self):
        """The online partition limits (adapt_sparse_core_limits=True), per sharded stacked table:
        {"max_ids_per_partition", "max_unique_ids_per_partition"}, the same on every replica and
        worker; None without adaptation or before build."""
        return None if self._online_limits is None else self._online_limits.read()

    def num_dropped_ids(self):
        """Ids dropped since build by `allow_id_dropping` (the all-gather exchange's CSR buffers
        were full), summed over this process's replicas; under MultiWorkerMirroredStrategy, sum
        the workers' values."""
        return sum(self._group.counter_values(collectives.DROPPED_IDS).values())

    def suggested_sparse_core_limits(self):
        """(max_ids_per_table, max_unique_ids_per_table) from the running maxima, for
        `SparseCoreEmbeddingConfig` of a job with this topology."""
        measured = self.sparse_core_stats or {}
        return ({n: v[stats_lib.MAX_IDS] for n, v in measured.items()},
                {n: v[stats_lib.MAX_UNIQUE_IDS] for n, v in measured.items()})

    def _stats_observer(self, summarize):
        """observe_maxima for enqueue_lib.preprocess, or None."""
        if self._stats is None:
            return None
        if summarize is None:   # one replica of the process writes the summaries
            context = tf.distribute.get_replica_context()
            summarize = True
            if context is not None and context.num_replicas_in_sync > 1:
                replica = tf.get_static_value(context.replica_id_in_sync_group)
                summarize = replica is None or int(replica) == self._group.local_replica_ids[0]
        return lambda maxima: self._stats.observe_maxima(maxima, summarize)

    def _local_parameters(self, view):
        variables = self._storage.stacked_variables()
        return {name: variables[name][PARAMETERS].shard(view.replica_id) for name in variables}

    def _local_variables(self, replica_id, layout):
        variables = self._storage.stacked_variables()
        return {name: (variables[name][PARAMETERS].shard(replica_id),
                       [variables[name][s].shard(replica_id)
                        for s in stacked.optimizer.slot_names])
                for name, stacked in layout.stacked_tables.items()}

    def dequeue(self, preprocessed):
        """Looks up this replica's activations; returns (activations, preserved)."""
        self._require_built("dequeue")
        view = collectives.ReplicaView(self._group)
        shards = self._local_parameters(view)
        stacked_activations = {}
        sharded, replicated = self._plan.sharded, self._plan.replicated
        preserved_sharded = preserved_replicated = None
        if sharded is not None and self._exchange == "all_to_all":
            activations, preserved_sharded = all_to_all_exchange.lookup(
                view, sharded, preprocessed, shards)
            stacked_activations.update(activations)
        elif sharded is not None:
            preserved_sharded, dropped = {}, []
            for name, stacked in sharded.stacked_tables.items():
                csr, num_dropped = all_gather_exchange.pack_and_gather(
                    view, sharded, stacked, preprocessed[name], self._sparse_core_config)
                stacked_activations[name] = all_gather_exchange.lookup(
                    view, sharded, stacked, csr, shards[name],
                    feature_rows_per_sc=self._feature_major_rows(name))
                preserved_sharded[name] = csr
                dropped.append(tf.cast(num_dropped, tf.int64))
            self._group.counter(view.replica_id, collectives.DROPPED_IDS).assign_add(
                tf.add_n(dropped))
        if self._online_limits is not None:
            self._online_limits.update(view)
        if replicated is not None:   # whole tables on every replica: looked up locally
            activations, preserved_replicated = all_to_all_exchange.lookup(
                collectives.LocalView(), replicated, preprocessed, shards)
            stacked_activations.update(activations)
        activations_by_path = {}
        for name, stacked in self._plan.stacked_tables.items():
            activations_by_path.update(enqueue_lib.unstack_activations(
                self._plan, stacked, stacked_activations[name],
                feature_major=self._feature_major_rows(name) is not None))
        flat = [activations_by_path[p] for p in self._flat_paths]
        return (tf.nest.pack_sequence_as(self._feature_config, flat),
                Preserved(preserved_sharded, preserved_replicated))

    def embedding_lookup(self, features, weights=None):
        """enqueue + dequeue: returns (activations, preserved)."""
        return self.dequeue(self.enqueue(features, weights))

    def __call__(self, features, weights=None):
        return self.embedding_lookup(features, weights)

    def apply_gradients(self, gradients, preserved_outputs):
        """Fused optimizer update from the gradients of the activations (None means zeros).

        Returns tensors to depend on (the update has run once they are computed; with
        non_finite_gradients="skip" they count the rows skipped). With pipelining the update of
        the previous step runs here and this step's is kept (docs/pipelining.md).
        """
        if not self.built:
            raise RuntimeError("apply_gradients called before the tables were built: call "
                               "embedding_lookup (or build) first")
        flat = self.flatten_features(gradients, "gradients", allow_none=True)
        by_path = dict(zip(self._flat_paths, flat))
        grads = {name: enqueue_lib.stack_gradients(self._plan, stacked, by_path,
                                                   self._gradient_order(name))
                 for name, stacked in self._plan.stacked_tables.items()}

        view = collectives.ReplicaView(self._group)
        self._check_preserved(preserved_outputs)
        targets = self._update_targets(view.replica_id)
        mode = self._non_finite_gradients
        skipped = []
        # No table is updated before every table's inputs passed validation: a bad id in one
        # feature must leave all tables unchanged, not only the table it belongs to.
        before = [t for t in tf.nest.flatten(preserved_outputs) if isinstance(t, tf.Tensor)]
        if self._pipelining:
            # The previous step's update, after this step's lookup (program order on the table
            # variables) and independent of this step's gradients: it overlaps the dense work.
            # This step's checks wait for it, so a failing step never cancels it half-way.
            skipped.append(self._stash.apply_pending(view.replica_id, targets, mode))
            before.append(skipped[-1])
        keys = list(targets)

        def run_now():
            results = [fused_update.run(targets[k], inputs[k], mode) for k in keys]
            if mode == "skip":
                return fused_update.skipped_rows([targets[k] for k in keys], results)
            with tf.control_dependencies(results):
                return tf.constant(0, tf.int64)

        def keep():
            with tf.control_dependencies([self._stash.keep(view.replica_id, inputs)]):
                return tf.constant(0, tf.int64)

        with tf.control_dependencies(before):
            flags = None
            if mode == "error":
                flags = gradient_check.non_finite_flags(
                    [None if g is None else tf.convert_to_tensor(g) for g in flat])
                if not self._flags_ride_with_gradients():
                    grads = self._require_finite(view.all_max(flags), grads)
                    flags = None
            inputs, agreed = self._update_inputs(view, preserved_outputs, grads, flags)
            if agreed is not None:
                inputs = self._require_finite(agreed, inputs)
            recording = pipelining.summaries_recording() if self._pipelining else True
            if recording is True:      # sequential (also while summaries are recorded)
                skipped.append(run_now())
            elif recording is False:
                skipped.append(keep())
            else:
                skipped.append(tf.cond(recording, run_now, keep))
        updates = list(skipped)
        if mode == "skip":
            counter = self._group.counter(view.replica_id, collectives.SKIPPED_GRADIENT_ROWS)
            updates.append(counter.assign_add(tf.add_n(skipped)))
        return updates

    def _feature_major_rows(self, name):
        """Each feature's rows per SparseCore if the lookup of stacked table `name` writes its
        activations feature-major and its update reads the gradients in that order
        (docs/lookup.md#activation-row-order), else None. Only the CSR lookups (one replica, or
        the all-gather exchange) have that order."""
        sharded = self._plan.sharded
        if sharded is None or self._exchange == "all_to_all" or name not in sharded.stacked_tables:
            return None
        return enqueue_lib.feature_major_rows(sharded, sharded.stacked_tables[name])

    def _gradient_order(self, name):
        """How apply_gradients stacks table `name`'s gradients: per feature (no copy) when the
        update reads them in place (one replica), feature-major when they are all-gathered first,
        else in the CSR's order."""
        if self._feature_major_rows(name) is None:
            return enqueue_lib.SPARSE_CORE_MAJOR
        return (enqueue_lib.PER_FEATURE if self._exchange == "single"
                else enqueue_lib.FEATURE_MAJOR)

    def apply_pending_gradients(self):
        """Applies the update a pipelined step kept for the next step (docs/pipelining.md).

        Needed before evaluating or reading the tables after the last pipelined step; the
        embedding's reads (logical tables, checkpoints, serving export) call it themselves. No
        collective is involved, so each process may call it on its own, eagerly or in a
        `tf.function`: outside `strategy.run` for every local replica, inside it for the calling
        replica. Without pipelining it does nothing.
        """
        if self._stash is None:
            return []
        results = []
        mode = self._non_finite_gradients
        replicas = zip(self._group.local_replica_ids, self._group.local_devices)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            replica_id = collectives.ReplicaView(self._group).replica_id
            replicas = [(replica_id, self._group.device_of(replica_id))]
        for replica_id, device in replicas:
            with tf.device(device):
                skipped = self._stash.apply_pending(replica_id, self._update_targets(replica_id),
                                                    mode)
                if mode == "skip":
                    counter = self._group.counter(replica_id, collectives.SKIPPED_GRADIENT_ROWS)
                    skipped = counter.assign_add(skipped)
                results.append(skipped)
        return results

    def _update_targets(self, replica_id):
        """{(part, stacked name): fused_update.UpdateTarget} of one replica's updates per step."""
        targets = {}
        sharded, replicated = self._plan.sharded, self._plan.replicated
        if sharded is not None:
            arguments = (all_to_all_exchange.owned_rows_arguments(sharded, replica_id)
                         if self._exchange == "all_to_all"
                         else all_gather_exchange.shard_arguments(sharded, replica_id))
            for name, (parameters, slots) in self._local_variables(replica_id, sharded).items():
                rows = self._feature_major_rows(name)
                targets[(SHARDED, name)] = fused_update.UpdateTarget(
                    sharded.stacked_tables[name],
                    arguments if rows is None else dict(arguments, feature_rows_per_sc=rows),
                    parameters, slots, True)
        if replicated is not None:   # whole tables: every replica updates them alike
            arguments = all_to_all_exchange.owned_rows_arguments(replicated, 0)
            for name, (parameters, slots) in self._local_variables(replica_id,
                                                                   replicated).items():
                targets[(REPLICATED, name)] = fused_update.UpdateTarget(
                    replicated.stacked_tables[name], arguments, parameters, slots,
                    replica_id == 0)
        return targets

    def _update_inputs(self, view, preserved, grads, flags=None):
        """({(part, stacked name): fused_update.UpdateInputs} of this step (exchanges included),
        the agreed `flags` or None): flags (int32 [F]) are agreed in the sharded tables'
        gradient all-to-all (see _flags_ride_with_gradients)."""
        inputs, agreed = {}, None
        sharded, replicated = self._plan.sharded, self._plan.replicated
        if flags is not None and not self._flags_ride_with_gradients():
            raise ValueError("non-finite flags can only travel with the gradient all-to-all")
        if sharded is not None and self._exchange == "all_to_all":
            received, agreed = all_to_all_exchange.exchange_gradients(
                view, sharded, preserved.sharded, grads, flags)
            for name, value in all_to_all_exchange.owned_rows_inputs(
                    sharded, view.replica_id, received).items():
                inputs[(SHARDED, name)] = value
        elif sharded is not None:
            for name in sharded.stacked_tables:
                inputs[(SHARDED, name)] = all_gather_exchange.update_inputs(
                    view, preserved.sharded[name], grads[name])
        if replicated is not None:
            local_rows, _ = all_to_all_exchange.exchange_gradients(
                collectives.LocalView(), replicated, preserved.replicated, grads)
            merged = all_to_all_exchange.sparse_allreduce(view, replicated, local_rows)
            for name, value in all_to_all_exchange.owned_rows_inputs(replicated, 0,
                                                                     merged).items():
                inputs[(REPLICATED, name)] = value
        return inputs, agreed

    def _flags_ride_with_gradients(self):
        """Whether the non-finite flags are agreed inside the all-to-all of the gradient rows
        (exchange.exchange_gradients) instead of by an all-gather of their own: with sharded
        tables under the all-to-all exchange and several replicas."""
        return (self._plan.sharded is not None and self._exchange == "all_to_all" and
                self._num_replicas > 1)

    def _require_finite(self, agreed_flags, values):
        """The all-or-nothing check of docs/optimizers.md#non-finite-gradients.

        Every replica marks the features whose gradient has a NaN or Inf, and the marks are
        agreed over all replicas (`agreed_flags`: an all-gather of their own, or inside the
        gradient exchange), so every replica takes the same decision. The stateless check fails
        the step on every replica before any write: the updates consume `values` (the stacked
        gradients, or the update inputs after the exchange) only as forwarded by the check.
        """
        tables = [feature.table.name for feature in tf.nest.flatten(self._feature_config)]
        checked = gradient_check.require_finite_gradients(
            agreed_flags, tf.nest.flatten(values), self._flat_paths, tables)
        return tf.nest.pack_sequence_as(values, checked)

    @tf.autograph.experimental.do_not_convert
    def _check_preserved(self, preserved):
        """preserved_outputs must be what dequeue returned (checked before any collective)."""
        def a2a_ok(part, layout):
            return (isinstance(part, tuple) and len(part) == 2 and isinstance(part[0], dict) and
                    set(part[0]) == set(layout.stacked_tables) and
                    all(isinstance(v, all_to_all_exchange.ExchangedTable)
                        for v in part[0].values()) and
                    isinstance(part[1], all_to_all_exchange.ExchangeSizes))

        def gather_ok(part, layout):
            return (isinstance(part, dict) and set(part) == set(layout.stacked_tables) and
                    all(isinstance(v, all_gather_exchange.PreservedCsr) for v in part.values()))

        sharded, replicated = self._plan.sharded, self._plan.replicated
        ok = isinstance(preserved, Preserved)
        if ok:
            if sharded is None:
                ok = preserved.sharded is None
            else:
                check = a2a_ok if self._exchange == "all_to_all" else gather_ok
                ok = check(preserved.sharded, sharded)
            ok = ok and ((preserved.replicated is None) if replicated is None
                         else a2a_ok(preserved.replicated, replicated))
        if not ok or not all(isinstance(t, (tf.Tensor, tf.Variable))
                             for t in tf.nest.flatten(preserved) if t is not None):
            raise ValueError("preserved_outputs must be the second value returned by dequeue / "
                             "embedding_lookup of this embedding in the same step (stacked "
                             f"tables {sorted(self._plan.stacked_tables)}); got "
                             f"{type(preserved).__name__}")


def placement_by_name(overrides):
    """table_placement keyed by table name; a key may also be the table's TableConfig."""
    by_name = {}
    for key, placement in dict(overrides).items():
        name = key.name if isinstance(key, tf.tpu.experimental.embedding.TableConfig) else key
        if not isinstance(name, str):
            raise ValueError(f"table_placement keys must be table names or TableConfig objects, "
                             f"got {key!r} ({type(key).__name__})")
        by_name[name] = placement
    return by_name


def _replicated_tables(feature_config, threshold_bytes, overrides):
    """Names of the tables to replicate: at most threshold_bytes of parameters, or overridden."""
    names = table_names(feature_config)
    overrides = placement_by_name(overrides)
    unknown = set(overrides) - set(names)
    if unknown:
        raise ValueError(f"table_placement names unknown tables {sorted(unknown)}; the tables "
                         f"are {sorted(names)}")
    replicated = set()
    for name, table in names.items():
        placement = overrides.get(name)
        if placement not in (None, SHARDED, REPLICATED):
            raise ValueError(f"table '{name}': table_placement must be '{SHARDED}' or "
                             f"'{REPLICATED}', got {placement!r}")
        size = int(table.vocabulary_size) * int(table.dim) * 4
        if placement == REPLICATED or (placement is None and size <= threshold_bytes):
            replicated.add(name)
    return frozenset(replicated)
