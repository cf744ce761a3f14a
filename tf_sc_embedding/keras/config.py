"""JSON-serializable configs of TensorFlow's embedding config classes, for `EmbeddingLayer`'s
`get_config` / `from_config` (full-model `.keras` saving).

Serialized: the nesting of the feature config (dicts, lists, tuples), every `FeatureConfig`
(name, output_shape, max_sequence_length, validate_weights_and_indices, its table by name),
every `TableConfig` once (vocabulary_size, dim, name, combiner, initializer, optimizer,
quantization_config), the embedding optimizers of `tf.tpu.experimental.embedding` (their
constructor arguments; a learning rate or slot creation function that is a Python callable cannot
be serialized) and `SparseCoreEmbeddingConfig`.

Initializers: Keras initializers through `keras.saving.serialize_keras_object`; TensorFlow's
(`tf.constant_initializer`, TableConfig's default truncated normal, other `init_ops_v2`
classes) as their class path and `get_config()`; any other callable cannot be serialized.
"""
import importlib
import inspect

import numpy as np
import tensorflow as tf

import keras

from tf_sc_embedding.optimizers.configs import SUPPORTED_CONFIGS as _OPTIMIZERS

E = tf.tpu.experimental.embedding


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def serialize_initializer(initializer, where):
    if initializer is None:
        return None
    if isinstance(initializer, keras.initializers.Initializer):
        return {"keras": keras.saving.serialize_keras_object(initializer)}
    cls = type(initializer)
    if hasattr(initializer, "get_config") and cls.__module__.startswith("tensorflow."):
        return {"tf_class": f"{cls.__module__}:{cls.__qualname__}",
                "config": _plain(initializer.get_config())}
    raise ValueError(f"{where}: the initializer {initializer!r} cannot be serialized for .keras "
                     "saving; use a Keras initializer or a tf.*_initializer")


def deserialize_initializer(config):
    if config is None:
        return None
    if "keras" in config:
        return keras.saving.deserialize_keras_object(config["keras"])
    module, name = config["tf_class"].split(":")
    if not module.startswith("tensorflow."):   # checked before importing: a file's text
        raise ValueError(f"refusing to load initializer class {config['tf_class']}")
    cls = getattr(importlib.import_module(module), name)
    return cls.from_config(config["config"]) if hasattr(cls, "from_config") \
        else cls(**config["config"])


def _constructor_args(obj, where):
    args = {}
    for name, param in list(inspect.signature(type(obj).__init__).parameters.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name == "clipvalue":
            low, high = obj.clip_gradient_min, obj.clip_gradient_max
            args[name] = None if low is None and high is None else [low, high]
            continue
        value = getattr(obj, name)
        if name == "slot_variable_creation_fn" and value is None:
            args[name] = None
            continue
        if callable(value):
            raise ValueError(f"{where}: '{name}' is a Python callable, which cannot be serialized "
                             "for .keras saving")
        args[name] = _plain(value)
    return args


def serialize_optimizer(optimizer, where="optimizer"):
    if optimizer is None:
        return None
    name = type(optimizer).__name__
    if _OPTIMIZERS.get(name) is not type(optimizer):
        raise ValueError(f"{where}: {name} is not one of the embedding optimizers "
                         f"{sorted(_OPTIMIZERS)} (TensorFlow's and RowWiseAdagrad)")
    return {"class_name": name, "config": _constructor_args(optimizer, where)}


def deserialize_optimizer(config):
    if config is None:
        return None
    args = dict(config["config"])
    if args.get("clipvalue") is not None:
        args["clipvalue"] = tuple(args["clipvalue"])
    return _OPTIMIZERS[config["class_name"]](**args)


def serialize_sparse_core_config(config):
    if config is None:
        return None
    return _constructor_args(config, "sparse_core_embedding_config")


def deserialize_sparse_core_config(config):
    return None if config is None else E.SparseCoreEmbeddingConfig(**config)


def _serialize_table(table):
    quantization = getattr(table, "quantization_config", None)
    return {"quantization_config": None if quantization is None else {
                "num_buckets": int(quantization.num_buckets),
                "lower": float(quantization.lower), "upper": float(quantization.upper)},
            "vocabulary_size": int(table.vocabulary_size), "dim": int(table.dim),
            "name": table.name, "combiner": table.combiner,
            "initializer": serialize_initializer(table.initializer, f"table '{table.name}'"),
            "optimizer": serialize_optimizer(table.optimizer, f"table '{table.name}'")}


def serialize_feature_config(feature_config):
    tables = {}

    def node(value):
        if isinstance(value, E.FeatureConfig):
            table = value.table
            if table.name in tables and tables[table.name][0] is not table:
                raise ValueError(f"two different TableConfigs are named '{table.name}'")
            tables[table.name] = (table, _serialize_table(table))
            shape = value.output_shape.as_list() if value.output_shape.rank is not None else None
            return {"feature": {"name": value.name, "table": table.name, "output_shape": shape,
                                "max_sequence_length": int(value.max_sequence_length),
                                "validate_weights_and_indices":
                                    bool(value.validate_weights_and_indices)}}
        if isinstance(value, dict):
            return {"dict": {str(k): node(v) for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            return {"tuple" if isinstance(value, tuple) else "list": [node(v) for v in value]}
        raise ValueError(f"feature_config holds a {type(value).__name__}; only dicts, lists, "
                         "tuples and FeatureConfigs can be serialized")

    structure = node(feature_config)
    return {"tables": [t[1] for t in tables.values()], "structure": structure}


def deserialize_feature_config(config):
    tables = {}
    for t in config["tables"]:
        tables[t["name"]] = E.TableConfig(
            vocabulary_size=t["vocabulary_size"], dim=t["dim"], name=t["name"],
            combiner=t["combiner"], initializer=deserialize_initializer(t["initializer"]),
            optimizer=deserialize_optimizer(t["optimizer"]),
            quantization_config=None if t.get("quantization_config") is None else
            E.QuantizationConfig(**t["quantization_config"]))

    def node(value):
        if "feature" in value:
            f = value["feature"]
            return E.FeatureConfig(table=tables[f["table"]], name=f["name"],
                                   output_shape=f["output_shape"],
                                   max_sequence_length=f["max_sequence_length"],
                                   validate_weights_and_indices=f["validate_weights_and_indices"])
        if "dict" in value:
            return {k: node(v) for k, v in value["dict"].items()}
        if "tuple" in value:
            return tuple(node(v) for v in value["tuple"])
        return [node(v) for v in value["list"]]

    return node(config["structure"])
