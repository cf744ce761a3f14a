"""`TPUEmbeddingV2`: TensorFlow's SparseCore embedding programming model, running on CPU.

Construct it (under a `tf.distribute` strategy scope or without one) from TensorFlow's own
`tf.tpu.experimental.embedding` configs, then per step: `enqueue` (host preprocessing) and
`dequeue` (lookup), or `embedding_lookup` / `__call__` for both, and `apply_gradients` with the
gradients of the activations. Tables are built on first use (or by `build`) because the layout
depends on the per-replica batch size.

This class only delegates (docs/architecture.md): options, layout, variables, logical tables,
the step over the plan's exchanges, deltas, checkpoints and counters each have their module. A new
kind of table, exchange or transport enters through those, never as a method here
(docs/architecture.md#growing).
"""
import dataclasses
import threading

import tensorflow as tf

from tf_sc_embedding.saving import checkpointing
from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.tables import dynamic_tables as dynamic_lib
from tf_sc_embedding.tables import dynamic_vocabulary
from tf_sc_embedding.deltas.stream import DeltaStream
from tf_sc_embedding import exchanges as exchanges_lib
from tf_sc_embedding.tables import feature_shapes
from tf_sc_embedding import private_tf
from tf_sc_embedding.preprocessing import stats as stats_lib
from tf_sc_embedding.tables.layout import (REPLICATED, SHARDED, EmbeddingPlan, flat_feature_paths,
                                    table_names)
from tf_sc_embedding.tables.logical_tables import LogicalTables
from tf_sc_embedding.options import EmbeddingOptions
from tf_sc_embedding.step import prefetch as prefetch_lib
from tf_sc_embedding.step.counters import read_counters
from tf_sc_embedding.step.embedding_step import EmbeddingStep
from tf_sc_embedding.tables.table_storage import PARAMETERS, TableStorage, as_tensor_zero_copy


class TPUEmbeddingV2(tf.Module):
    """Sharded embedding tables with fused optimizers; see the module docstring.

    feature_config, optimizer, sparse_core_embedding_config: TensorFlow's.
    pipeline_execution_with_tensor_core: TensorFlow's meaning on CPU (docs/pipelining.md): each
      step's fused update runs during the next step, after that step's lookup, overlapping its
      dense work; activations are one update stale. Sequential while summaries are recorded.
    options / keyword arguments: this library's extra options, documented (with their defaults)
      in one place: `tf_sc_embedding.EmbeddingOptions`.
    """

    def __init__(self, feature_config, optimizer=None, pipeline_execution_with_tensor_core=False,
                 sparse_core_embedding_config=None, *, options=None, **extra_options):
        super().__init__(name="tpu_embedding_v2")
        self._options = EmbeddingOptions.from_arguments(options, **extra_options)
        self._feature_config = feature_config
        self._optimizer = optimizer
        self._pipelining = bool(pipeline_execution_with_tensor_core)
        self._sparse_core_config = sparse_core_embedding_config
        self._strategy = tf.distribute.get_strategy()
        self._group = collectives.ReplicaGroup(self._strategy,
                                               **self._options.replica_group_arguments())
        self._exchange = exchanges_lib.choose(self._options.exchange, self._group.num_replicas,
                                              sparse_core_embedding_config)
        self._flat_paths = flat_feature_paths(feature_config)
        tables_by_name = table_names(feature_config)
        self._replicated = self._options.replicated_tables(tables_by_name,
                                                           self._group.num_replicas)
        self._dtypes = self._options.storage_dtypes(tables_by_name)
        vocabularies = self._options.dynamic_tables(tables_by_name)
        # The layout sees each dynamic table as its rows plus a scratch row (dynamic_vocabulary).
        self._laid_out_features = dynamic_vocabulary.laid_out_features(
            feature_config, set(vocabularies), tables_by_name, self._group.num_replicas,
            self._options.sparse_cores_per_replica)
        self._build_lock = threading.Lock()
        self._step = None
        # Fail fast on bad configs (optimizers, combiners, names) before any input is seen.
        config_plan = self._make_plan({p: (self._options.sparse_cores_per_replica,)
                                       for p in self._flat_paths})
        placements = {t.name: t for s in config_plan.stacked_tables.values() for t in s.tables}
        self._tables = LogicalTables({name: (t.config, t.optimizer)
                                      for name, t in placements.items()})
        self._dynamic = dynamic_lib.DynamicTables(
            vocabularies, tables_by_name, placements, self._tables, self._group.num_replicas,
            self._group.local_replica_ids,
            self._group.gather_local_arrays if self._group.is_multi_worker else None)
        self._deltas = (DeltaStream(self._tables, self._dynamic, self._group)
                        if self._options.delta_tracking else None)
        self._checkpoint = checkpointing.CheckpointChildren(
            self, self._fixed_names(),
            {name: dynamic_lib.DynamicTableNode(self._dynamic, name) for name in vocabularies},
            with_update_step=(set(self._dtypes.values()) != {"float32"} or
                              self._deltas is not None), delta_stream=self._deltas)

    def _make_plan(self, shapes):
        config = self._sparse_core_config
        if self._options.adapt_sparse_core_limits and config is not None:
            # Limits raised to cover every batch never split one into minibatches: preprocess
            # without limits (the same result); the configured values start the online limits.
            config = dataclasses.replace(config, max_ids_per_table=None,
                                         max_unique_ids_per_table=None)
        return EmbeddingPlan(self._laid_out_features, self._optimizer, self._group.num_replicas,
                             self._options.sparse_cores_per_replica, shapes, config,
                             replicated=self._replicated, dtypes=self._dtypes,
                             rounding=self._options.table_rounding,
                             dynamic=frozenset(self._options.dynamic_vocabularies))

    def build(self, per_replica_batch_size=None, output_shapes=None):
        """Lays out and creates the tables for a per-replica batch size (or per-feature shapes)."""
        with self._build_lock:
            if self._step is not None:
                return
            shapes = feature_shapes.per_replica_shapes(
                self._feature_config, self._flat_paths, per_replica_batch_size, output_shapes,
                private_tf.flatten_up_to, self._options.sparse_cores_per_replica,
                self._group.num_replicas)
            plan = self._make_plan(shapes)

            def create_storage(initial):
                storage = TableStorage(plan, self._group)
                storage.create(initial)
                self._group.create_variables()
                touched = self._deltas.attach(plan, storage) if self._deltas else None
                self._step = EmbeddingStep(
                    plan, storage, exchanges_lib.build(plan, self._exchange, self._group,
                                                       self._sparse_core_config, self._dynamic,
                                                       storage),
                    self._group, self._options, self._sparse_core_config, self._pipelining,
                    touched)
                # Tracked as attributes so that tf.Module finds the table variables.
                self._variables = storage.stacked_variables()
                return storage, self.apply_pending_gradients, self._step.discard_kept

            self._tables.build(create_storage)

    built = property(lambda self: self._step is not None)

    def _require_built(self, what):
        if self._step is None:
            raise RuntimeError(f"{what} needs the tables: call build(), embedding_lookup() or "
                               "enqueue() first")
        return self._step

    # ----------------------------------------------------------------------------- properties
    options = property(lambda self: self._options, doc="The EmbeddingOptions in use.")
    feature_config = property(lambda self: self._feature_config)
    replica_group = property(lambda self: self._group,
                             doc="The replicas (global ids of this process's replicas, devices).")
    tables = property(lambda self: self._tables,
                      doc="The logical tables (logical_tables.LogicalTables), built or not.")
    exchange = property(lambda self: self._exchange,
                        doc='"all_to_all", "all_gather" or "single" (one replica: no exchange).')

    feature_paths = property(lambda self: list(self._flat_paths),
                             doc="The joined string paths of the features, in flatten order.")
    storage = property(lambda self: self._require_built("storage").storage,
                       doc="The `TableStorage` that owns the per-replica variables.")
    plan = property(lambda self: self._require_built("plan").plan,
                    doc="The `layout.EmbeddingPlan` of the built tables.")

    def per_replica_feature_shapes(self):
        """Per flat feature, the per-replica shape of its samples (after build)."""
        return [tuple(f.output_shape) for f in self._require_built("feature shapes").plan.features]

    embedding_layouts = property(
        lambda self: self._require_built("embedding_layouts").plan.table_layouts(),
        doc="Where every table lives: table name -> TableLayout (stacked name, offsets, rotation).")

    placement_plan = property(
        lambda self: {name: REPLICATED if name in self._replicated else SHARDED
                      for name in self._tables.names},
        doc='Table name -> "sharded" (over all replicas) or "replicated" (whole on every one).')

    variables = property(
        lambda self: self._require_built("variables").storage.stacked_variables(),
        doc='Stacked table name -> {"parameters": ShardedTable, <slot>: ShardedTable} (local).')

    @property
    def embedding_tables(self):
        """The user's TableConfig -> its logical [vocabulary_size, dim] table (numpy array).
        With several worker processes this is a collective read: call it on every worker."""
        self._require_built("embedding_tables")
        return {self._tables.config(name): self._tables.read(name) for name in self._fixed_names()}

    def _fixed_names(self):
        """The tables with a fixed vocabulary (the others: export_dynamic_table)."""
        return [name for name in self._tables.names if name not in self._dynamic.names]

    @property
    def embedding_table_shards(self):
        """The user's TableConfig -> its stacked table's variables on this process's replicas."""
        step = self._require_built("embedding_table_shards")
        variables = step.storage.stacked_variables()
        return {t.config: list(variables[name][PARAMETERS].shards)
                for name, s in step.plan.stacked_tables.items() for t in s.tables}

    def logical_slot(self, table_config, slot_name):
        """One optimizer slot of one user table, in the logical [vocabulary_size, dim] view
        ([vocabulary_size, 1] for a row-wise slot)."""
        self._require_built("logical_slot")
        return self._tables.read(self._tables.name_of(table_config), slot_name)

    def logical_tables(self, include_slots=False, as_numpy=True):
        """Table name -> logical table (numpy, or tf.Tensor if not as_numpy); with include_slots,
        table name -> {kind: value}. With several workers a collective read."""
        self._require_built("logical_tables")
        convert = (lambda v: v) if as_numpy else as_tensor_zero_copy
        result = {}
        for name in self._fixed_names():
            kinds = self._tables.kinds(name) if include_slots else (PARAMETERS,)
            values = {kind: convert(self._tables.read(name, kind)) for kind in kinds}
            result[name] = values if include_slots else values[PARAMETERS]
        return result

    def export_serving(self, export_dir, **kwargs):
        """Writes a SavedModel that looks features up with stock TensorFlow ops only
        (`tf_sc_embedding.saving.serving.export_serving`)."""
        from tf_sc_embedding.saving import serving  # pylint: disable=import-outside-toplevel
        return serving.export_serving(self, export_dir, **kwargs)

    # ----------------------------------------------------------------------------- dynamic tables
    def export_dynamic_table(self, table):
        """(keys, values) of an open-vocabulary table (a name or its TableConfig): numpy, the keys
        holding rows in ascending order ([n]; bytes for string keys) and their rows ([n, dim]).
        With several worker processes a collective: every worker must call it."""
        name = table.name if isinstance(table, tf.tpu.experimental.embedding.TableConfig) else table
        return self._dynamic.export(name)

    dynamic_tables = property(lambda self: self._dynamic,
                              doc="The open-vocabulary tables (dynamic_tables.DynamicTables).")

    # ----------------------------------------------------------------------------- deltas
    def export_delta(self, directory, include_optimizer_state=False, blocking=True):
        """Writes what training changed since the previous delta into a new delta directory
        under `directory` (docs/deltas.md); returns its path, or a Future of it when not
        blocking. include_optimizer_state: also what `apply_delta` needs to resume training."""
        stream = self._require_deltas("export_delta")
        self.apply_pending_gradients()
        return stream.export(directory, include_optimizer_state, self.update_step(), blocking)

    def apply_delta(self, path):
        """Applies a delta with optimizer state that follows the tables' position (a restored
        checkpoint or delta); writes nothing on any error (docs/deltas.md#positions-and-chains)."""
        stream = self._require_deltas("apply_delta")
        self._step.discard_kept()
        return stream.apply(path, self.restore_update_step)

    deltas = property(lambda self: self._deltas,
                      doc="The deltas.stream.DeltaStream, or None without delta_tracking.")

    def _require_deltas(self, what):
        if self._require_built(what) and self._deltas is None:
            raise ValueError(f"{what} needs an embedding built with delta_tracking=True")
        return self._deltas

    # ----------------------------------------------------------------------------- checkpoints
    _sce_checkpoint_writer = True   # saved by checkpointing's registered saver

    def _trackable_children(self, save_type=None, **kwargs):
        # Only the logical nodes: the per-replica variables depend on the topology.
        return self._checkpoint.children()

    def _lookup_dependency(self, name, cached_dependencies=None):
        children = self.__dict__.get("_checkpoint")
        node = children.lookup(name) if children is not None else None
        return node if node is not None else super()._lookup_dependency(name, cached_dependencies)

    def update_step(self):
        """Fused updates applied so far (equal on every replica): the step that stochastically
        rounds 16-bit rows; a restore sets it, so training resumes exactly."""
        self.apply_pending_gradients()   # a kept (pipelined) update counts, as in the tables
        return self._group.update_step()

    def restore_update_step(self, value):
        """Sets the update step on every local replica (kept until build() when not built)."""
        self._group.restore_update_step(value)

    def checkpoint_nodes(self):
        """Table name -> checkpointing.LogicalTable."""
        return dict(self._checkpoint.tables)

    # ----------------------------------------------------------------------------- steps
    def enqueue(self, features, weights=None, device=None):
        """Host preprocessing of one replica's batch (eagerly, in `tf.function`, in replica
        context or in `tf.data.Dataset.map`; on `device` if given); returns per stacked table its
        sorted ids. In cross-replica context with per-replica inputs, every local replica's batch
        is preprocessed into a per-replica value that `dequeue` takes in `strategy.run`."""
        if not feature_shapes.has_distributed_values(features, weights):
            return self._enqueue_one(features, weights, device)
        return self._group.map_local_replicas(self._enqueue_one, features, weights, device,
                                              "enqueue")

    def _enqueue_one(self, features, weights, device, summarize=None):
        flat, flat_weights = self._flatten_batch(features, weights, "features")
        return self._require_built_from(flat).enqueue(flat, flat_weights, device, summarize)

    def _flatten_batch(self, features, weights, what):
        return feature_shapes.flatten_batch(self._feature_config, features, weights, what)

    def _require_built_from(self, flat):
        """The step, building the tables first from the shapes of a batch (flat ids)."""
        if not self.built:
            self.build(output_shapes=tf.nest.pack_sequence_as(
                self._feature_config, [feature_shapes.sample_shape(p, f)
                                       for p, f in zip(self._flat_paths, flat)]))
        return self._step

    def dequeue(self, preprocessed, training=True):
        """Looks up this replica's activations; returns (activations, preserved).
        training=False (inference): open-vocabulary tables read their keys' rows without
        admitting or counting keys (docs/dynamic_vocabulary.md#in-the-class)."""
        flat, preserved = self._require_built("dequeue").dequeue(preprocessed,
                                                                  training=training)
        return tf.nest.pack_sequence_as(self._feature_config, flat), preserved

    def embedding_lookup(self, features, weights=None, next_features=None, next_weights=None,
                         training=True):
        """enqueue + dequeue: returns (activations, preserved).

        training=False: see `dequeue` (open vocabularies only; fixed tables are read alike).

        next_features (and next_weights), with pipeline_execution_with_tensor_core=True: the
        next step's batch, whose lookup runs during this step and completes in the next one;
        this step's own lookup must have been prefetched, by the previous step or `prefetch`
        (docs/pipelining.md#prefetching-the-next-lookup). The numbers are pipelining's.
        """
        if next_features is None:
            if next_weights is not None:
                raise ValueError("next_weights given without next_features")
            return self.dequeue(self.enqueue(features, weights), training=training)
        prefetch_lib.check_prefetch_call("next_features", self._pipelining, features, weights,
                                         next_features, next_weights)
        current = self._flatten_batch(features, weights, "features")
        upcoming = self._flatten_batch(next_features, next_weights, "next_features")
        prefetch_lib.check_next_batch(self._flat_paths, current[0], upcoming[0])
        step = self._require_built_from(current[0])
        flat, preserved = step.lookup_prefetching(lambda: step.enqueue(*upcoming), current,
                                                  upcoming, training)
        return tf.nest.pack_sequence_as(self._feature_config, flat), preserved

    def prefetch(self, features, weights=None):
        """Pipelining, in a replica's step: looks a batch up now and keeps it for the next
        `embedding_lookup(features=<this batch>, next_features=...)`; call it before the first
        such step and after a restore (docs/pipelining.md#prefetching-the-next-lookup)."""
        prefetch_lib.check_prefetch_call("prefetch", self._pipelining, features, weights)
        batch = self._flatten_batch(features, weights, "features")
        step = self._require_built_from(batch[0])
        return step.prefetch(step.enqueue(*batch), batch)

    def __call__(self, features, weights=None, next_features=None, next_weights=None,
                 training=True):
        return self.embedding_lookup(features, weights, next_features, next_weights, training)

    def apply_gradients(self, gradients, preserved_outputs):
        """Fused optimizer update from the gradients of the activations (None means zeros);
        returns tensors to depend on (with non_finite_gradients="skip", the rows skipped). With
        pipelining the previous step's update runs here, this one's is kept (docs/pipelining.md).
        """
        if not self.built:
            raise RuntimeError("apply_gradients called before the tables were built: call "
                               "embedding_lookup (or build) first")
        flat = feature_shapes.flatten_like(self._feature_config, gradients, "gradients",
                                           allow_none=True)
        return self._step.apply_gradients(flat, preserved_outputs)

    def apply_pending_gradients(self):
        """Applies the update a pipelined step kept (docs/pipelining.md); reads of the tables
        call it themselves. Needs no collective: eagerly or in a `tf.function`, outside
        `strategy.run` for every local replica, inside it for the calling replica."""
        if self._step is None:
            return []
        return self._step.apply_pending(self._group.calling_replicas())

    # ----------------------------------------------------------------------------- statistics
    @classmethod
    def compute_sparse_core_stats(cls, features, feature_config, num_tpu_chips, num_sc_per_chip=4,
                                  optimizer=None, sparse_core_embedding_config=None):
        """TensorFlow's: (max ids, max unique ids) per partition, dicts by stacked table name."""
        return stats_lib.compute_sparse_core_stats(
            features, feature_config, num_tpu_chips, num_sc_per_chip, optimizer,
            sparse_core_embedding_config)

    sparse_core_stats = property(
        lambda self: _read(self._step and self._step.stats),
        doc="Running partition maxima of the batches enqueued here, per stacked table (None "
            "when not tracked or not built).")
    sparse_core_limits = property(
        lambda self: _read(self._step and self._step.online_limits),
        doc="The online partition limits (adapt_sparse_core_limits), per sharded stacked table.")

    def suggested_sparse_core_limits(self):
        """(max_ids_per_table, max_unique_ids_per_table) from the running maxima."""
        return stats_lib.suggested_limits(self.sparse_core_stats or {})

    def counters(self):
        """Every counter (dropped ids, skipped gradient rows, bytes sent, open vocabularies'
        unadmitted ids and refused keys) as one `EmbeddingCounters` record. With several worker
        processes and open vocabularies a collective: every worker must call it."""
        return read_counters(self._group, self._dynamic)


def _read(tracker):
    return None if tracker is None else tracker.read()
