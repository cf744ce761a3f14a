"""`TPUEmbeddingV2`: TensorFlow's SparseCore embedding programming model, running on CPU.

Construct it (under a `tf.distribute` strategy scope or without one) from TensorFlow's own
`tf.tpu.experimental.embedding` configs, then per step: `enqueue` (host preprocessing) and
`dequeue` (lookup), or `embedding_lookup` / `__call__` for both, and `apply_gradients` with the
gradients of the activations. Tables are built on first use (or by `build`) because the layout
depends on the per-replica batch size.
"""
import contextlib
import threading
from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.util import nest

from tf_sc_embedding import checkpointing
from tf_sc_embedding import enqueue as enqueue_lib
from tf_sc_embedding import sharded_lookup
from tf_sc_embedding import sharded_tables
from tf_sc_embedding.layout import EmbeddingLayout
from tf_sc_embedding.sharded_tables import create_sharded_tables, read_logical_table

DEFAULT_SPARSE_CORES_PER_REPLICA = 4


class TPUEmbeddingV2(tf.Module):
    """Sharded embedding tables with fused optimizers; see the module docstring."""

    def __init__(self, feature_config, optimizer=None, pipeline_execution_with_tensor_core=False,
                 sparse_core_embedding_config=None,
                 sparse_cores_per_replica=DEFAULT_SPARSE_CORES_PER_REPLICA):
        super().__init__(name="tpu_embedding_v2")
        self._feature_config = feature_config
        self._optimizer = optimizer
        self._pipelining = pipeline_execution_with_tensor_core
        self._sparse_core_config = sparse_core_embedding_config
        self._sparse_cores = sparse_cores_per_replica
        self._strategy = tf.distribute.get_strategy()
        self._num_replicas = self._strategy.num_replicas_in_sync
        self._devices = self._replica_devices()
        self._build_lock = threading.Lock()
        self._layout = None
        self._tables = None
        self._flat_paths = [p for p, _ in nest.flatten_with_joined_string_paths(feature_config)]
        # Fail fast on bad configs (optimizers, combiners, names) before any input is seen.
        config_layout = self._check_config()
        # Checkpoint nodes, one per user table, named by table (see checkpointing.py). They exist
        # before build() so that a checkpoint restored early is consumed by build().
        self._pending_restore = None
        self._logical_nodes = {
            t.name: checkpointing.LogicalTable(self, t.name, t.config, t.optimizer.slot_names)
            for s in config_layout.stacked_tables.values() for t in s.tables}

    # ----------------------------------------------------------------------------- building
    def _replica_devices(self):
        try:
            devices = list(self._strategy.extended.worker_devices)
        except (RuntimeError, AttributeError):  # the default strategy has no worker devices
            devices = []
        if len(devices) != self._num_replicas:
            devices = [None] * self._num_replicas
        return devices

    def _check_config(self):
        shapes = {p: (self._sparse_cores,) for p in self._flat_paths}
        return EmbeddingLayout(self._feature_config, self._optimizer, self._num_replicas,
                               self._sparse_cores, shapes, self._sparse_core_config)

    def build(self, per_replica_batch_size=None, output_shapes=None):
        """Lays out and creates the tables for a per-replica batch size (or per-feature shapes)."""
        with self._build_lock:
            if self._layout is not None:
                return
            shapes = {}
            flat_features = nest.flatten(self._feature_config)
            given = (nest.flatten_up_to(self._feature_config, output_shapes)
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
            layout = EmbeddingLayout(self._feature_config, self._optimizer, self._num_replicas,
                                     self._sparse_cores, shapes, self._sparse_core_config)
            pending = self._pending_restore

            def from_checkpoint(table, kind):
                if pending is None or not pending.has(table.name, kind):
                    return None
                return pending.read(table.name, kind)

            with tf.init_scope():
                self._tables = {name: create_sharded_tables(stacked, self._devices,
                                                            self._sparse_cores, from_checkpoint)
                                for name, stacked in layout.stacked_tables.items()}
            self._layout = layout
            self._pending_restore = None

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
        return nest.pack_sequence_as(self._feature_config, shapes)

    @property
    def built(self):
        return self._layout is not None

    # ----------------------------------------------------------------------------- properties
    @property
    def embedding_layouts(self):
        """Where every table lives: table name -> TableLayout (stacked name, offsets, rotation)."""
        self._require_built("embedding_layouts")
        return self._layout.table_layouts()

    @property
    def variables(self):
        """Stacked table name -> {"parameters": ShardedTable, <slot>: ShardedTable}."""
        self._require_built("variables")
        return self._tables

    @property
    def embedding_tables(self):
        """The user's TableConfig -> its logical [vocabulary_size, dim] table (numpy array)."""
        self._require_built("embedding_tables")
        return {t.config: read_logical_table(self._tables[name]["parameters"], t,
                                             self._sparse_cores)
                for name, s in self._layout.stacked_tables.items() for t in s.tables}

    @property
    def embedding_table_shards(self):
        """The user's TableConfig -> the per-replica variables of the stacked table holding it."""
        self._require_built("embedding_table_shards")
        return {t.config: list(self._tables[name]["parameters"].shards)
                for name, s in self._layout.stacked_tables.items() for t in s.tables}

    def logical_slot(self, table_config, slot_name):
        """One optimizer slot of one user table, in the logical [vocabulary_size, dim] view."""
        self._require_built("logical_slot")
        for name, s in self._layout.stacked_tables.items():
            for t in s.tables:
                if t.config is table_config:
                    return read_logical_table(self._tables[name][slot_name], t, self._sparse_cores)
        raise KeyError(f"unknown table {table_config}")

    def logical_tables(self, include_slots=False, as_numpy=True):
        """Table name -> logical [vocabulary_size, dim] table (numpy, or tf.Tensor if not as_numpy).

        With include_slots, table name -> {"parameters": ..., <slot name>: ...}.
        """
        self._require_built("logical_tables")
        result = {}
        for name, node in self._logical_nodes.items():
            kinds = node.kinds if include_slots else (checkpointing.PARAMETERS,)
            values = {}
            for kind in kinds:
                value = self._gather_logical(name, kind)
                values[kind] = value if as_numpy else sharded_tables.as_tensor_zero_copy(value)
            result[name] = values if include_slots else values[checkpointing.PARAMETERS]
        return result

    def export_serving(self, export_dir, **kwargs):
        """Writes a SavedModel that looks features up with stock TensorFlow ops only.

        See `tf_sc_embedding.serving.export_serving` for the signatures.
        """
        from tf_sc_embedding import serving  # pylint: disable=import-outside-toplevel
        return serving.export_serving(self, export_dir, **kwargs)

    # ----------------------------------------------------------------------------- checkpoints
    def _trackable_children(self, save_type=None, **kwargs):
        # Only the per-table logical nodes: the per-replica variables depend on the topology and
        # are never checkpointed directly.
        return dict(self._logical_nodes)

    def _placement(self, table_name):
        for stacked in self._layout.stacked_tables.values():
            for table in stacked.tables:
                if table.name == table_name:
                    return table
        raise KeyError(f"unknown table '{table_name}'")

    def _gather_logical(self, table_name, kind):
        """The logical value of one table's parameters or slot (numpy, or a tensor in graphs)."""
        placement = self._placement(table_name)
        sharded = self._tables[placement.layout.stacked_table_name][kind]
        if tf.executing_eagerly():
            return sharded_tables.gather_logical(sharded, placement, self._sparse_cores)
        return sharded_tables.gather_logical_tf(sharded, placement, self._sparse_cores)

    def _restore_logical(self, pending):
        """Restores checkpointed logical tables now, or at build() if not built yet."""
        with self._build_lock:
            if self._layout is None:
                if self._pending_restore is not None:   # a later restore wins per table
                    merged = dict(self._pending_restore.keys)
                    prefixes = {self._pending_restore.prefix, pending.prefix}
                    if len(prefixes) == 1:
                        merged.update(pending.keys)
                        pending = checkpointing.PendingRestore(pending.prefix, merged)
                self._pending_restore = pending
                return
        with tf.init_scope():
            for name, kinds in pending.keys.items():
                placement = self._placement(name)
                for kind in kinds:
                    sharded = self._tables[placement.layout.stacked_table_name][kind]
                    value = pending.read(name, kind)
                    sharded_tables.assign_logical(sharded, placement, self._sparse_cores, value)
                    del value

    def _require_built(self, what):
        if self._layout is None:
            raise RuntimeError(f"{what} needs the tables: call build(), embedding_lookup() or "
                               "enqueue() first")

    # ----------------------------------------------------------------------------- steps
    def _flatten(self, structure, what, allow_none=False):
        try:
            nest.assert_same_structure(self._feature_config, structure)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{what} must have the same structure as feature_config: {e}") from None
        flat = nest.flatten(structure)
        if not allow_none and any(x is None for x in flat):
            raise ValueError(f"{what} contains None")
        return flat

    def enqueue(self, features, weights=None, device=None):
        """Host preprocessing of one replica's batch; returns per stacked table sorted ids.

        Works eagerly, in `tf.function`, in replica context and inside `tf.data.Dataset.map`.
        """
        flat = self._flatten(features, "features")
        flat_weights = ([None] * len(flat) if weights is None else
                        self._flatten(weights, "weights", allow_none=True))
        if not self.built:
            self.build(output_shapes=self._output_shapes_of(flat))
        with tf.device(device) if device else contextlib.nullcontext():
            return enqueue_lib.preprocess(self._layout, flat, flat_weights)

    def dequeue(self, preprocessed):
        """Looks up this replica's activations; returns (activations, preserved)."""
        self._require_built("dequeue")
        view = sharded_lookup.ReplicaView(self._num_replicas)
        activations_by_path, preserved = {}, {}
        for name, stacked in self._layout.stacked_tables.items():
            csr = sharded_lookup.pack_and_gather(view, self._layout, stacked, preprocessed[name],
                                                 self._sparse_core_config)
            shard = self._tables[name]["parameters"].shards[view.replica_id]
            activations = sharded_lookup.lookup(view, self._layout, stacked, csr, shard)
            activations_by_path.update(
                sharded_lookup.unstack_activations(self._layout, stacked, activations))
            preserved[name] = csr
        flat = [activations_by_path[p] for p in self._flat_paths]
        return nest.pack_sequence_as(self._feature_config, flat), preserved

    def embedding_lookup(self, features, weights=None):
        """enqueue + dequeue: returns (activations, preserved)."""
        return self.dequeue(self.enqueue(features, weights))

    def __call__(self, features, weights=None):
        return self.embedding_lookup(features, weights)

    def apply_gradients(self, gradients, preserved_outputs):
        """Fused optimizer update from the gradients of the activations (None means zeros)."""
        if not self.built:
            raise RuntimeError("apply_gradients called before the tables were built: call "
                               "embedding_lookup (or build) first")
        flat = self._flatten(gradients, "gradients", allow_none=True)
        by_path = dict(zip(self._flat_paths, flat))
        view = sharded_lookup.ReplicaView(self._num_replicas)
        updates = []
        # No table is updated before every table's inputs passed validation: a bad id in one
        # feature must leave all tables unchanged, not only the table it belongs to.
        validated = [t for t in nest.flatten(preserved_outputs) if isinstance(t, tf.Tensor)]
        for name, stacked in self._layout.stacked_tables.items():
            grads = sharded_lookup.stack_gradients(self._layout, stacked, by_path)
            variables = self._tables[name]
            slots = [variables[s].shards[view.replica_id] for s in stacked.optimizer.slot_names]
            with tf.control_dependencies(validated):
                updates.append(sharded_lookup.apply_update(
                    view, self._layout, stacked, preserved_outputs[name], grads,
                    variables["parameters"].shards[view.replica_id], slots))
        return updates

