"""`EmbeddingLayer`: a Keras 3 layer (TensorFlow backend) that owns a `TPUEmbeddingV2`.

    with strategy.scope():                      # or no strategy
        layer = EmbeddingLayer(feature_config, optimizer=E.Adagrad(0.05), batch_size=1024)
        activations = layer(ids)                # nested dense / ragged / sparse int ids

The layer is used like any Keras layer in functional and subclassed models; `model.fit`,
`evaluate` and `predict` work unchanged, and the tables train with **their own fused per-table
optimizer** (the `optimizer` given here or each `TableConfig.optimizer`), never with the model's.

How `fit` reaches the fused update: Keras differentiates the loss only with respect to the model's
trainable variables, and the tables are not Keras variables (the model optimizer never sees them,
so it creates no slot for any table row). The layer owns one scalar trainable variable, the
*trigger* (always 0). The activations are passed through a `tf.custom_gradient` function whose
inputs include the trigger; its gradient function receives the activations' gradients, runs
`TPUEmbeddingV2.apply_gradients` with them (as a control dependency of its result) and returns a
zero gradient for the trigger, so any model optimizer leaves the trigger at 0. Under
`MirroredStrategy` this runs in replica context, inside Keras's per-replica train step; Keras scales
each replica's loss by 1 / replicas and the embedding sums the replicas' gradients, so a step
applies the gradient of the global batch's mean loss, as for the dense weights.
`predict` and `evaluate` compute no gradients and never update the tables; `training=False` and
`layer.trainable = False` (frozen tables) detach the update path entirely.

Batch size: the tables' layout depends on the per-replica batch, fixed when the tables are built:
from `batch_size` (global) if given, else from the static batch size of the first call. Smaller
batches (e.g. the last one of `predict`) are padded with empty samples and the padding is sliced
off; use `drop_remainder=True` for training data so every training batch is full.

Dense ids: a dense [batch, n] feature is n one-id samples per row, with activations
[batch, n, dim], as in TensorFlow. With `batch_size` the tables are built at construction for one
id per sample (unless every FeatureConfig has an output_shape) and laid out again, values kept,
when the layer first sees dense [batch, n] inputs (a functional model's `keras.Input`s or the
first call), before any step.

Checkpoints: `tf.train.Checkpoint(model=model)` saves the tables per user table in their logical
(unstacked, unsharded) form via `TPUEmbeddingV2`'s checkpoint nodes (topology independent); the
Keras files (`model.save("m.keras")`, `model.save_weights`, `ModelCheckpoint`,
`BackupAndRestore`) store the logical tables and optimizer slots as well (`save_own_variables`),
and `get_config` / `from_config` serialize the configs (keras_config.py), so
`keras.models.load_model` rebuilds the layer.
Preprocessing in `tf.data`: `layer.preprocess(ids)` is the host half of the lookup
(`TPUEmbeddingV2.enqueue`) for one full per-replica batch. Map it over the batched dataset and
prefetch, and the step only looks rows up; pass its result to the layer where the ids would go:

    dataset = dataset.batch(1024, drop_remainder=True).map(
        lambda x, y: ({"dense": x["dense"], "ids": layer.preprocess(x["ids"])}, y)).prefetch(2)
    activations = layer(inputs["ids"])   # a PreprocessedFeatures: only the lookup runs here

The activations are bit-for-bit those of `layer(ids)`. With several replicas each replica's batch
is preprocessed on its own: build the dataset with `strategy.distribute_datasets_from_function`
(per-replica batches) and give that to `fit`.

Custom training loops keep working: `layer.embedding` is the `TPUEmbeddingV2` (enqueue, dequeue,
apply_gradients), and a loop differentiating a loss with respect to `model.trainable_variables`
updates the tables through the trigger exactly as `fit` does.
"""
import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

import keras

from tf_sc_embedding import checkpointing
from tf_sc_embedding import collectives
from tf_sc_embedding import keras_compat
from tf_sc_embedding import keras_config
from tf_sc_embedding.embedding import (DEFAULT_REPLICATION_THRESHOLD_BYTES, TPUEmbeddingV2,
                                       placement_by_name)
from tf_sc_embedding.layout import DEFAULT_SPARSE_CORES_PER_REPLICA

_TABLE_KEY = "table:{table}:{kind}"

# What `EmbeddingLayer.preprocess` returns: the embedding's enqueue output for one per-replica
# batch (per stacked table, sorted or bucketed ids), wrapped so that `call` can tell it from ids.
PreprocessedFeatures = collections.namedtuple("PreprocessedFeatures", ["stacked_tables"])
_TRIGGER_KEY = "trigger"


def _in_keras_symbolic_scope():
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    return in_symbolic_scope()


def _batch_size_of(feature):
    """Dynamic batch size (rows) of a dense, ragged or sparse feature tensor."""
    if isinstance(feature, tf.RaggedTensor):
        return feature.nrows(out_type=tf.int32)
    if isinstance(feature, tf.SparseTensor):
        return tf.cast(feature.dense_shape[0], tf.int32)
    return tf.shape(feature, out_type=tf.int32)[0]


def _static_batch_size(feature):
    if isinstance(feature, tf.SparseTensor):
        value = tf.get_static_value(feature.dense_shape)
        return None if value is None else int(value[0])
    return feature.shape[0]


def _pad_to(feature, rows):
    """Pads a feature to exactly `rows` samples (empty samples; id 0 for dense features)."""
    if isinstance(feature, tf.RaggedTensor):
        splits = feature.row_splits
        extra = rows + 1 - tf.shape(splits, out_type=splits.dtype)[0]
        splits = tf.concat([splits, tf.fill(tf.reshape(extra, [1]), splits[-1])], axis=0)
        splits = tf.ensure_shape(splits, [rows + 1])
        return tf.RaggedTensor.from_row_splits(feature.values, splits, validate=False)
    if isinstance(feature, tf.SparseTensor):
        shape = tf.concat([tf.constant([rows], tf.int64), feature.dense_shape[1:]], axis=0)
        static = [rows] + feature.shape.as_list()[1:]
        return tf.SparseTensor(feature.indices, feature.values, tf.ensure_shape(shape, [len(static)]))
    feature = tf.convert_to_tensor(feature)
    extra = rows - tf.shape(feature)[0]
    paddings = tf.concat([tf.reshape(extra, [1, 1]) * tf.constant([[0, 1]]),
                          tf.zeros([feature.shape.rank - 1, 2], tf.int32)], axis=0)
    padded = tf.pad(feature, paddings)
    return tf.ensure_shape(padded, [rows] + feature.shape.as_list()[1:])


@keras.saving.register_keras_serializable(package="tf_sc_embedding")
class EmbeddingLayer(keras.layers.Layer):
    """A Keras layer owning a `TPUEmbeddingV2`; see the module docstring.

    Args:
      feature_config: nested `tf.tpu.experimental.embedding.FeatureConfig`s (as for
        `TPUEmbeddingV2`); the layer's input must have the same structure.
      optimizer: the default per-table optimizer (a `tf.tpu.experimental.embedding` optimizer);
        tables with their own `TableConfig.optimizer` use that one.
      batch_size: optional global batch size; builds the tables now (per-replica batch =
        batch_size / replicas). Otherwise they are built at the first call.
      sparse_core_embedding_config, sparse_cores_per_replica, non_finite_gradients,
        adapt_sparse_core_limits, pipeline_execution_with_tensor_core, exchange,
        replication_threshold_bytes, table_placement, collective_timeout_seconds: as for
        `TPUEmbeddingV2` (saved in the layer's config; table_placement keyed by table name).
    Call: ``layer(features, weights=None, training=None)`` -> activations with the structure of
      `feature_config`: [batch, dim] per ragged, sparse or 1-D dense feature, [batch, n, dim] per
      2-D dense feature. `features` may also be what `preprocess` returned (then `weights` must
      be None: they were given to `preprocess`).
    """

    _sce_embedding_layer = True   # recognized by keras_compat

    def __init__(self, feature_config, optimizer=None, batch_size=None,
                 sparse_core_embedding_config=None,
                 sparse_cores_per_replica=DEFAULT_SPARSE_CORES_PER_REPLICA,
                 non_finite_gradients="error", adapt_sparse_core_limits=False,
                 pipeline_execution_with_tensor_core=False, exchange="auto",
                 replication_threshold_bytes=DEFAULT_REPLICATION_THRESHOLD_BYTES,
                 table_placement=None,
                 collective_timeout_seconds=collectives.DEFAULT_TIMEOUT_SECONDS, **kwargs):
        super().__init__(**kwargs)
        self._feature_config = feature_config
        self._embedding_kwargs = dict(
            optimizer=optimizer, sparse_core_embedding_config=sparse_core_embedding_config,
            sparse_cores_per_replica=sparse_cores_per_replica,
            non_finite_gradients=non_finite_gradients,
            adapt_sparse_core_limits=adapt_sparse_core_limits,
            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
            exchange=exchange, replication_threshold_bytes=replication_threshold_bytes,
            table_placement=placement_by_name(table_placement or {}),
            collective_timeout_seconds=collective_timeout_seconds)
        self.embedding = TPUEmbeddingV2(feature_config, **self._embedding_kwargs)
        self._num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        # The scalar trainable variable that puts the tables' update on Keras's gradient path.
        self.trigger = self.add_weight(name="table_update_trigger", shape=(),
                                       initializer="zeros", trainable=True)
        self._batch_size = batch_size
        self._per_replica_batch = None
        self._layout_revisable = False
        if batch_size is not None:
            if batch_size % self._num_replicas:
                raise ValueError(f"batch_size {batch_size} is not divisible by the "
                                 f"{self._num_replicas} replicas")
            self._per_replica_batch = batch_size // self._num_replicas
            self.embedding.build(per_replica_batch_size=self._per_replica_batch)
            # Built for one id per sample unless every FeatureConfig has an output_shape: a dense
            # [batch, n] input (n one-id samples per row, activations [batch, n, dim], as in
            # TensorFlow) lays the tables out again when the layer first sees its inputs, before
            # any step, keeping their values.
            self._layout_revisable = not all(f.output_shape.rank
                                             for f in nest.flatten(feature_config))
        self.built = True

    def _relayout(self, shapes):
        """Lays the tables out for per-feature shapes (dense [batch, n] inputs), values kept."""
        self._layout_revisable = False
        if [tuple(s) for s in shapes] == self.embedding.per_replica_feature_shapes():
            return
        old = self.embedding
        with tf.init_scope():
            values = old.logical_tables(include_slots=True)   # arrays: held until build()
            embedding = TPUEmbeddingV2(self._feature_config, **self._embedding_kwargs)
            embedding.restore_logical(values)
            embedding.build(output_shapes=nest.pack_sequence_as(self._feature_config, shapes))
        self.embedding = embedding

    @property
    def feature_config(self):
        return self._feature_config

    # -------------------------------------------------------------------------- .keras saving
    def get_config(self):
        """Keras config: the feature, table, optimizer and SparseCore configs (keras_config)."""
        config = super().get_config()
        kwargs = self._embedding_kwargs
        config.update(
            feature_config=keras_config.serialize_feature_config(self._feature_config),
            optimizer=keras_config.serialize_optimizer(kwargs["optimizer"]),
            batch_size=self._batch_size,
            sparse_core_embedding_config=keras_config.serialize_sparse_core_config(
                kwargs["sparse_core_embedding_config"]),
            sparse_cores_per_replica=kwargs["sparse_cores_per_replica"],
            non_finite_gradients=kwargs["non_finite_gradients"],
            adapt_sparse_core_limits=kwargs["adapt_sparse_core_limits"],
            pipeline_execution_with_tensor_core=kwargs["pipeline_execution_with_tensor_core"],
            exchange=kwargs["exchange"],
            replication_threshold_bytes=kwargs["replication_threshold_bytes"],
            table_placement=dict(kwargs["table_placement"]),
            collective_timeout_seconds=kwargs["collective_timeout_seconds"])
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["feature_config"] = keras_config.deserialize_feature_config(
            config["feature_config"])
        config["optimizer"] = keras_config.deserialize_optimizer(config.get("optimizer"))
        config["sparse_core_embedding_config"] = keras_config.deserialize_sparse_core_config(
            config.get("sparse_core_embedding_config"))
        return cls(**config)

    # -------------------------------------------------------------------------- Keras plumbing
    def build(self, *args, **kwargs):  # the tables are built from the batch size, not shapes
        self.built = True

    def compute_output_spec(self, features, weights=None, training=None):
        if isinstance(features, PreprocessedFeatures):   # laid out already (preprocess checks)
            shapes = self.embedding.per_replica_feature_shapes()
            return nest.pack_sequence_as(self._feature_config, [
                keras.KerasTensor(tuple(shape) + (config.table.dim,), dtype="float32")
                for shape, config in zip(shapes, nest.flatten(self._feature_config))])
        if self._layout_revisable:
            # batch_size given: the (symbolic) inputs tell which features are dense [batch, n].
            shapes = []
            for feature in self.embedding.flatten_features(features, "features"):
                composite = getattr(feature, "ragged", False) or getattr(feature, "sparse", False) \
                    or isinstance(feature, (tf.RaggedTensor, tf.SparseTensor))
                inner = [] if composite else list(feature.shape[1:])
                if None in inner:
                    raise ValueError(f"dense ids need static dimensions after the batch, got "
                                     f"shape {tuple(feature.shape)}")
                shapes.append([self._per_replica_batch] + inner)
            self._relayout(shapes)

        def spec(feature, config):
            if getattr(feature, "ragged", False) or getattr(feature, "sparse", False) or \
                    isinstance(feature, (tf.RaggedTensor, tf.SparseTensor)) or \
                    len(feature.shape) == 1:
                shape = (feature.shape[0], config.table.dim)
            else:
                shape = tuple(feature.shape) + (config.table.dim,)
            return keras.KerasTensor(shape, dtype="float32")
        return nest.map_structure_up_to(self._feature_config, spec, features,
                                        self._feature_config)

    # -------------------------------------------------------------------------- forward
    def _per_replica_rows(self):
        return [shape[0] for shape in self.embedding.per_replica_feature_shapes()]

    def _ensure_built(self, flat):
        if self.embedding.built and not self._layout_revisable:
            return
        shapes = []
        for path, feature in zip(self.embedding.feature_paths, flat):
            rows = self._per_replica_batch or _static_batch_size(feature)
            if rows is None:
                raise ValueError(
                    f"feature '{path}': the batch size is not static, so the embedding tables "
                    "cannot be laid out; pass batch_size= to EmbeddingLayer (the global batch) "
                    "or batch the dataset with drop_remainder=True")
            if isinstance(feature, (tf.RaggedTensor, tf.SparseTensor)):
                shapes.append([rows])
            else:
                inner = tf.convert_to_tensor(feature).shape.as_list()[1:]
                if None in inner:
                    raise ValueError(f"feature '{path}': dense ids need static dimensions after "
                                     f"the batch, got shape {feature.shape}")
                shapes.append([rows] + inner)
        if self._layout_revisable:
            self._relayout(shapes)
            return
        with tf.init_scope():
            self.embedding.build(output_shapes=nest.pack_sequence_as(self._feature_config, shapes))

    def preprocess(self, features, weights=None):
        """The host half of the lookup for one full per-replica batch, e.g. in `Dataset.map`.

        Returns a `PreprocessedFeatures` to pass to the layer instead of the ids (see the module
        docstring). The batch must have exactly the per-replica batch size the tables were laid
        out for (no padding happens here), so the tables must be built: give `batch_size`.
        """
        if not self.embedding.built:
            raise ValueError("preprocess needs the tables' layout: construct the layer with "
                             "batch_size= (the global batch)")
        flat = self.embedding.flatten_features(features, "features")
        for path, feature, shape in zip(self.embedding.feature_paths, flat,
                                        self.embedding.per_replica_feature_shapes()):
            rows = _static_batch_size(feature)
            if rows != shape[0]:
                raise ValueError(
                    f"feature '{path}': preprocess takes full per-replica batches of {shape[0]} "
                    f"samples (static), got {rows}; batch the dataset with drop_remainder=True "
                    "and, with several replicas, per replica")
        return PreprocessedFeatures(self.embedding.enqueue(features, weights))

    def call(self, features, weights=None, training=None):
        if isinstance(features, PreprocessedFeatures):
            return self._call_preprocessed(features, weights, training)
        flat = self.embedding.flatten_features(features, "features")
        if _in_keras_symbolic_scope():
            return self._symbolic_outputs(flat)
        flat_weights = (None if weights is None else
                        self.embedding.flatten_features(weights, "weights", allow_none=True))
        self._ensure_built(flat)
        rows = self._per_replica_rows()
        sizes = [_batch_size_of(f) for f in flat]
        padded = []
        needs_slice = []
        for feature, n, static in zip(flat, rows, (_static_batch_size(f) for f in flat)):
            padded.append(feature if static == n else _pad_to(feature, n))
            needs_slice.append(static != n)
        if flat_weights is not None:
            flat_weights = [w if w is None or not pad else _pad_to(w, n)
                            for w, n, pad in zip(flat_weights, rows, needs_slice)]
            flat_weights = nest.pack_sequence_as(self._feature_config, flat_weights)
        self._drain_pipeline(training)
        activations, preserved = self.embedding(
            nest.pack_sequence_as(self._feature_config, padded), flat_weights)
        flat_activations = nest.flatten(activations)
        if self.trainable and training is not False:
            flat_activations = self._attach_update(flat_activations, preserved)
        flat_activations = [a[:size] if pad else a
                            for a, size, pad in zip(flat_activations, sizes, needs_slice)]
        return nest.pack_sequence_as(self._feature_config, flat_activations)

    def _call_preprocessed(self, preprocessed, weights, training):
        """The lookup (and the update path) of a batch that `preprocess` prepared."""
        if weights is not None:
            raise ValueError("weights belong to preprocess(features, weights), not to the call "
                             "with its result")
        if _in_keras_symbolic_scope():
            shapes = self.embedding.per_replica_feature_shapes()
            return nest.pack_sequence_as(self._feature_config, [
                tf.zeros(list(shape) + [config.table.dim])
                for shape, config in zip(shapes, nest.flatten(self._feature_config))])
        self._drain_pipeline(training)
        activations, preserved = self.embedding.dequeue(preprocessed.stacked_tables)
        flat_activations = nest.flatten(activations)
        if self.trainable and training is not False:
            flat_activations = self._attach_update(flat_activations, preserved)
        return nest.pack_sequence_as(self._feature_config, flat_activations)

    def _drain_pipeline(self, training):
        """With pipelining, an inference call (predict, evaluate) first applies the update the
        last training step kept, so it sees fully trained tables."""
        if training is False or not self.trainable:
            # Stateful ops on the table variables: ordered before this call's lookup.
            self.embedding.apply_pending_gradients()

    def _symbolic_outputs(self, flat):
        """Zeros of the activations' shapes, for Keras's symbolic model building (placeholders
        in a scratch graph, outside replica context, ragged inputs seen as dense)."""
        built = self.embedding.built and not self._layout_revisable
        shapes = self.embedding.per_replica_feature_shapes() if built else [None] * len(flat)
        outputs = []
        for feature, config, shape in zip(flat, nest.flatten(self._feature_config), shapes):
            batch = _batch_size_of(feature)
            if shape is not None:
                inner = list(shape[1:])
            elif isinstance(feature, (tf.RaggedTensor, tf.SparseTensor)) or \
                    feature.shape.rank is None or None in feature.shape.as_list()[1:]:
                inner = []      # ragged and sparse inputs arrive here as [batch, None]
            else:   # dense [batch, n...]: one sample per id, as the tables will be built
                inner = feature.shape.as_list()[1:]
            outputs.append(tf.zeros(tf.concat([[batch], tf.constant(inner + [config.table.dim],
                                                                     tf.int32)], 0)))
        return nest.pack_sequence_as(self._feature_config, outputs)

    def _attach_update(self, flat_activations, preserved):
        """Identity on the activations whose gradient applies the fused per-table update."""
        embedding = self.embedding
        structure = self._feature_config
        trigger = tf.convert_to_tensor(self.trigger)

        @tf.custom_gradient
        def attach(trigger, *activations):
            def grad(*upstream):
                updates = embedding.apply_gradients(
                    nest.pack_sequence_as(structure, list(upstream)), preserved)
                with tf.control_dependencies(nest.flatten(updates)):
                    # Computed from the trigger's value rather than a constant zero: Grappler
                    # folds a constant gradient and prunes the update it depends on.
                    trigger_grad = tf.identity(trigger) * 0.0
                return [trigger_grad] + [None] * len(activations)
            return [tf.identity(a) for a in activations], grad

        return attach(trigger, *[tf.stop_gradient(a) for a in flat_activations])

    # -------------------------------------------------------------------------- Keras weights
    def save_own_variables(self, store):
        """Keras weight files: the trigger and every table's logical parameters and slots."""
        store[_TRIGGER_KEY] = np.asarray(self.trigger.numpy())
        embedding = self.embedding
        for name, (height, _) in embedding.table_shapes.items():
            for kind in embedding.table_kinds(name):
                if embedding.built:
                    value = embedding.read_logical(name, kind)
                else:   # restored but not built yet: carry the restored values forward
                    value = embedding.pending_restore(name, kind)
                    if value is None:
                        continue
                    value = value(0, height)
                store[_TABLE_KEY.format(table=name, kind=kind)] = value

    def load_own_variables(self, store):
        """Keras weight files: every shape is checked before any table is written.

        Keras's store reads a whole array per key. Into built tables the arrays are read one at a
        time (once for the shape check, once to write), so memory holds one table, not all of
        them; before build() they are all kept until the tables exist (the file is closed by then).
        """
        keys = set(store.keys())
        if _TRIGGER_KEY in keys:
            self.trigger.assign(np.asarray(store[_TRIGGER_KEY]))
        wanted = [(name, kind, _TABLE_KEY.format(table=name, kind=kind))
                  for name in self.embedding.table_shapes
                  for kind in self.embedding.table_kinds(name)]
        built = self.embedding.built
        shapes, kept = {}, {}
        for _, _, key in wanted:
            if key in keys:
                value = np.asarray(store[key])
                shapes[key] = tuple(value.shape)
                if not built:
                    kept[key] = value
                del value
        self._check_tables(shapes)
        for name, kind, key in wanted:
            if key not in shapes:
                continue
            value = kept.pop(key) if not built else np.asarray(store[key])
            self.embedding.restore_logical({name: {kind: value}})
            del value

    def _check_tables(self, shapes):
        """shapes: {weights-file key: shape} of the table arrays the file holds."""
        for name, shape in self.embedding.table_shapes.items():
            key = _TABLE_KEY.format(table=name, kind=checkpointing.PARAMETERS)
            if key not in shapes:
                raise ValueError(f"the weights file has no table '{name}'")
            for kind in self.embedding.table_kinds(name):
                found = shapes.get(_TABLE_KEY.format(table=name, kind=kind))
                if found is not None and found != shape:
                    raise ValueError(f"table '{name}': the weights file's {kind} has shape "
                                     f"{list(found)}, the TableConfig {list(shape)}")


# The adaptation of Keras's model building under a strategy (ragged / sparse first batches, and the
# multi-worker rejection) lives in keras_compat; installed on import of this module.
MULTI_WORKER_FIT_MESSAGE = keras_compat.MULTI_WORKER_FIT_MESSAGE
_reject_multi_worker_fit = keras_compat.reject_multi_worker_fit
keras_compat.install()
