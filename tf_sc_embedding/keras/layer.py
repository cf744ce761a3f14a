"""`EmbeddingLayer`: a Keras 3 layer (TensorFlow backend) that owns a `TPUEmbeddingV2`.

The tables train with their own fused per-table optimizer, never with the model's: the layer's one
trainable scalar (the *trigger*, always 0) carries the activations' gradients to
`TPUEmbeddingV2.apply_gradients` through a `tf.custom_gradient`. How `fit`, dense ids, padding,
preprocessing in `tf.data`, checkpoints and `.keras` files work: docs/keras.md.
"""
import collections

import numpy as np
import tensorflow as tf

import keras

from tf_sc_embedding.keras import batch_padding
from tf_sc_embedding.tables import feature_shapes
from tf_sc_embedding import keras_compat
from tf_sc_embedding.keras import config as keras_config
from tf_sc_embedding.keras import weights as keras_weights
from tf_sc_embedding.embedding import TPUEmbeddingV2
from tf_sc_embedding.options import EmbeddingOptions

# What `EmbeddingLayer.preprocess` returns: the embedding's enqueue output for one per-replica
# batch (per stacked table, sorted or bucketed ids), wrapped so that `call` can tell it from ids.
PreprocessedFeatures = collections.namedtuple("PreprocessedFeatures", ["stacked_tables"])


@keras.saving.register_keras_serializable(package="tf_sc_embedding")
class EmbeddingLayer(keras.layers.Layer):
    """A Keras layer owning a `TPUEmbeddingV2` (`layer.embedding`); see docs/keras.md.

    Args:
      feature_config, optimizer, sparse_core_embedding_config,
        pipeline_execution_with_tensor_core: as for `TPUEmbeddingV2`.
      batch_size: optional global batch size; builds the tables now (per-replica batch =
        batch_size / replicas). Otherwise they are built at the first call.
      options, or the options as keyword arguments: `tf_sc_embedding.EmbeddingOptions`.
      Other keyword arguments go to `keras.layers.Layer`.
    Call: ``layer(features, weights=None, training=None)`` -> activations with the structure of
      `feature_config`, or ``layer(layer.preprocess(features, weights))``.
    """

    _sce_embedding_layer = True   # recognized by keras_compat

    def __init__(self, feature_config, optimizer=None, batch_size=None,
                 sparse_core_embedding_config=None, pipeline_execution_with_tensor_core=False,
                 options=None, **kwargs):
        option_kwargs, layer_kwargs = EmbeddingOptions.split_arguments(kwargs)
        super().__init__(**layer_kwargs)
        self._feature_config = feature_config
        self._embedding_args = dict(
            optimizer=optimizer, sparse_core_embedding_config=sparse_core_embedding_config,
            pipeline_execution_with_tensor_core=bool(pipeline_execution_with_tensor_core),
            options=EmbeddingOptions.from_arguments(options, **option_kwargs))
        self.embedding = TPUEmbeddingV2(feature_config, **self._embedding_args)
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        # The scalar trainable variable that puts the tables' update on Keras's gradient path.
        self.trigger = self.add_weight(name="table_update_trigger", shape=(),
                                       initializer="zeros", trainable=True)
        self._batch_size = batch_size
        self._per_replica_batch = None
        self._layout_revisable = False
        if batch_size is not None:
            if batch_size % num_replicas:
                raise ValueError(f"batch_size {batch_size} is not divisible by the "
                                 f"{num_replicas} replicas")
            self._per_replica_batch = batch_size // num_replicas
            self.embedding.build(per_replica_batch_size=self._per_replica_batch)
            # Built for one id per sample unless every FeatureConfig has an output_shape; dense
            # [batch, n] inputs lay the tables out again, values kept, before any step.
            self._layout_revisable = not all(f.output_shape.rank
                                             for f in tf.nest.flatten(feature_config))
        self.built = True

    feature_config = property(lambda self: self._feature_config)

    def _flat(self, structure, what="features", allow_none=False):
        return feature_shapes.flatten_like(self._feature_config, structure, what, allow_none)

    def _pack(self, flat):
        return tf.nest.pack_sequence_as(self._feature_config, list(flat))

    # -------------------------------------------------------------------------- .keras saving
    def get_config(self):
        config = super().get_config()
        args = self._embedding_args
        config.update(
            feature_config=keras_config.serialize_feature_config(self._feature_config),
            optimizer=keras_config.serialize_optimizer(args["optimizer"]),
            batch_size=self._batch_size,
            sparse_core_embedding_config=keras_config.serialize_sparse_core_config(
                args["sparse_core_embedding_config"]),
            pipeline_execution_with_tensor_core=args["pipeline_execution_with_tensor_core"],
            **args["options"].to_config())
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

    # -------------------------------------------------------------------------- layout
    def build(self, *args, **kwargs):  # the tables are built from the batch size, not shapes
        self.built = True

    def _ensure_laid_out(self, flat):
        """Builds the tables for these inputs' sample shapes (or lays them out again)."""
        if self.embedding.built and not self._layout_revisable:
            return
        shapes = [feature_shapes.sample_shape(path, feature, self._per_replica_batch)
                  for path, feature in zip(self.embedding.feature_paths, flat)]
        if not self._layout_revisable:
            with tf.init_scope():
                self.embedding.build(output_shapes=self._pack(shapes))
            return
        self._layout_revisable = False
        if shapes == self.embedding.per_replica_feature_shapes():
            return
        with tf.init_scope():
            values = self.embedding.logical_tables(include_slots=True)   # held until build()
            dynamic = {name: self.embedding.dynamic_tables.logical_state(name)
                       for name in self.embedding.dynamic_tables.names}
            embedding = TPUEmbeddingV2(self._feature_config, **self._embedding_args)
            embedding.tables.restore(values)
            for name, state in dynamic.items():
                embedding.dynamic_tables.restore(name, state, "the previous layout")
            embedding.build(output_shapes=self._pack(shapes))
        self.embedding = embedding

    def compute_output_spec(self, features, weights=None, training=None):
        if isinstance(features, PreprocessedFeatures):   # laid out already (preprocess checks)
            dims = [(s[0], list(s[1:])) for s in self.embedding.per_replica_feature_shapes()]
        else:
            flat = self._flat(features)
            if self._layout_revisable:   # the symbolic inputs tell which ids are dense [b, n]
                self._ensure_laid_out(flat)
            dims = [feature_shapes.sample_dims(f) for f in flat]
        return self._pack(
            keras.KerasTensor(tuple([rows] + inner + [config.table.dim]), dtype="float32")
            for (rows, inner), config in zip(dims, tf.nest.flatten(self._feature_config)))

    # -------------------------------------------------------------------------- forward
    def preprocess(self, features, weights=None):
        """The host half of the lookup for one full per-replica batch, e.g. in `Dataset.map`;
        pass the result to the layer instead of the ids. Needs `batch_size` (built tables)."""
        if not self.embedding.built:
            raise ValueError("preprocess needs the tables' layout: construct the layer with "
                             "batch_size= (the global batch)")
        for path, feature, shape in zip(self.embedding.feature_paths, self._flat(features),
                                        self.embedding.per_replica_feature_shapes()):
            rows = feature_shapes.sample_dims(feature)[0]
            if rows != shape[0]:
                raise ValueError(
                    f"feature '{path}': preprocess takes full per-replica batches of {shape[0]} "
                    f"samples (static), got {rows}; batch the dataset with drop_remainder=True "
                    "and, with several replicas, per replica")
        return PreprocessedFeatures(self.embedding.enqueue(features, weights))

    def call(self, features, weights=None, training=None):
        preprocessed = isinstance(features, PreprocessedFeatures)
        if preprocessed and weights is not None:
            raise ValueError("weights belong to preprocess(features, weights), not to the call "
                             "with its result")
        flat = None if preprocessed else self._flat(features)
        if keras_compat.in_symbolic_scope():
            return self._symbolic_outputs(flat)
        if not preprocessed:
            self._ensure_laid_out(flat)
        # Inference (or frozen tables) reads open vocabularies without admitting keys.
        learns = self.trainable and training is not False
        if not learns:
            # With pipelining, inference first applies the last training step's kept update.
            self.embedding.apply_pending_gradients()
        if preprocessed:
            activations, preserved = self.embedding.dequeue(features.stacked_tables,
                                                            training=learns)
            sizes = None
        else:
            flat_weights = None if weights is None else self._flat(weights, "weights", True)
            rows = [s[0] for s in self.embedding.per_replica_feature_shapes()]
            sizes = [None if feature_shapes.sample_dims(f)[0] == n
                     else batch_padding.batch_size_of(f) for f, n in zip(flat, rows)]
            padded = [f if s is None else batch_padding.pad_to(f, n)
                      for f, s, n in zip(flat, sizes, rows)]
            if flat_weights is not None:
                flat_weights = self._pack(w if w is None or s is None else batch_padding.pad_to(
                    w, n) for w, s, n in zip(flat_weights, sizes, rows))
            activations, preserved = self.embedding(self._pack(padded), flat_weights,
                                                    training=learns)
        flat_activations = tf.nest.flatten(activations)
        if learns:
            flat_activations = self._attach_update(flat_activations, preserved)
        if sizes is not None:
            flat_activations = [a if s is None else a[:s] for a, s in zip(flat_activations, sizes)]
        return self._pack(flat_activations)

    def _symbolic_outputs(self, flat):
        """Zeros of the activations' shapes, for Keras's symbolic model building."""
        # Preprocessed inputs were laid out already; ids may still change a revisable layout.
        laid_out = flat is None or (self.embedding.built and not self._layout_revisable)
        shapes = self.embedding.per_replica_feature_shapes() if laid_out else None
        outputs = []
        for i, config in enumerate(tf.nest.flatten(self._feature_config)):
            if flat is None:
                batch, inner = shapes[i][0], list(shapes[i][1:])
            else:
                batch = batch_padding.batch_size_of(flat[i])
                inner = list(shapes[i][1:]) if shapes else feature_shapes.sample_dims(flat[i])[1]
                inner = [] if None in inner else inner   # ragged inputs seen as [batch, None]
            outputs.append(tf.zeros(tf.concat([[batch], tf.constant(inner + [config.table.dim],
                                                                     tf.int32)], 0)))
        return self._pack(outputs)

    def _attach_update(self, flat_activations, preserved):
        """Identity on the activations whose gradient applies the fused per-table update."""
        embedding, pack = self.embedding, self._pack
        trigger = tf.convert_to_tensor(self.trigger)

        @tf.custom_gradient
        def attach(trigger, *activations):
            def grad(*upstream):
                updates = embedding.apply_gradients(pack(upstream), preserved)
                with tf.control_dependencies(tf.nest.flatten(updates)):
                    # Computed from the trigger's value rather than a constant zero: Grappler
                    # folds a constant gradient and prunes the update it depends on.
                    trigger_grad = tf.identity(trigger) * 0.0
                return [trigger_grad] + [None] * len(activations)
            return [tf.identity(a) for a in activations], grad

        return attach(trigger, *[tf.stop_gradient(a) for a in flat_activations])

    # -------------------------------------------------------------------------- Keras weights
    def save_own_variables(self, store):
        store[keras_weights.TRIGGER_KEY] = np.asarray(self.trigger.numpy())
        keras_weights.save_tables(store, self.embedding.tables, self.embedding.dynamic_tables)

    def load_own_variables(self, store):
        if keras_weights.TRIGGER_KEY in set(store.keys()):
            self.trigger.assign(np.asarray(store[keras_weights.TRIGGER_KEY]))
        keras_weights.load_tables(store, self.embedding.tables, self.embedding.dynamic_tables)


# The adaptation of Keras's model building under a strategy (ragged / sparse first batches, and
# the multi-worker rejection) lives in keras_compat; installed on import of this module.
keras_compat.install()
