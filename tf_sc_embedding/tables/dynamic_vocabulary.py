"""`DynamicVocabulary`: the configuration of an open-vocabulary table (docs/dynamic_vocabulary.md).

A table named in `dynamic_vocabularies` takes arbitrary int64 or string keys instead of ids in
`[0, vocabulary_size)`; its `TableConfig.vocabulary_size` is the number of rows it holds. This
module is the one home of the configuration's rules: its validation, its config form, the table
the layout sees for it (its rows plus one scratch row) and the initial values of a row given to
a new key.
"""
import copy
import dataclasses
import numbers

import numpy as np
import tensorflow as tf

from tf_sc_embedding.tables.dynamic_shards import ShardRows
from tf_sc_embedding.ops.key_row_map import keyed_random_rows

KEY_DTYPES = ("int64", "string")


@dataclasses.dataclass(frozen=True)
class DynamicVocabulary:
    """An open vocabulary for one table.

    key_dtype: tf.int64 (any value, negative included) or tf.string.
    admission_threshold: a key gets a row once it has been seen this many times in all (counting
      every occurrence of every batch so far).
    steps_to_live: None keeps rows for good; T >= 1 takes a key's row back once the key has not
      been seen for more than T steps (its values and slots are reset before the row is reused).
    pending_capacity: keys counted below the threshold at once (None: the table's capacity);
      the exact counts take 16 bytes per key (docs/dynamic_vocabulary.md#memory-and-speed).
    """
    key_dtype: object = tf.int64
    admission_threshold: int = 1
    steps_to_live: object = None
    pending_capacity: object = None

    def __post_init__(self):
        name = getattr(self.key_dtype, "name", self.key_dtype)
        if name not in KEY_DTYPES:
            raise ValueError(f"DynamicVocabulary: key_dtype must be tf.int64 or tf.string, got "
                             f"{self.key_dtype!r}")
        object.__setattr__(self, "key_dtype", tf.as_dtype(name))
        _require_count("admission_threshold", self.admission_threshold)
        if self.steps_to_live is not None:
            _require_count("steps_to_live", self.steps_to_live)
        if self.pending_capacity is not None:
            _require_count("pending_capacity", self.pending_capacity)

    @classmethod
    def of(cls, table_name, value):
        """A DynamicVocabulary from itself or its config dict; errors name the table."""
        try:
            if isinstance(value, cls):
                return value
            if isinstance(value, dict):
                return cls.from_config(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"table '{table_name}': {e}") from None
        raise ValueError(f"table '{table_name}': dynamic_vocabularies values must be "
                         f"tf_sc_embedding.DynamicVocabulary, got {type(value).__name__}")

    def to_config(self):
        optional = lambda v: None if v is None else int(v)   # noqa: E731
        return {"key_dtype": self.key_dtype.name,
                "admission_threshold": int(self.admission_threshold),
                "steps_to_live": optional(self.steps_to_live),
                "pending_capacity": optional(self.pending_capacity)}

    @classmethod
    def from_config(cls, config):
        return cls(**dict(config))

    def map_arguments(self, capacity, pending_capacity=None):
        """The key-to-row map's arguments (ops.key_row_map.KeyRowMap) for one replica's share of
        the rows and of the pending counts (dynamic_shards.ShardRows)."""
        return dict(capacity=capacity, admission_threshold=int(self.admission_threshold),
                    steps_to_live=int(self.steps_to_live or 0),
                    pending_capacity=pending_capacity, key_dtype=self.key_dtype)


def _require_count(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"DynamicVocabulary: {name} must be an integer >= 1, got {value!r}")


def laid_out_table(table, num_replicas, sparse_cores_per_replica):
    """The TableConfig the layout sees for a dynamic table: every replica's rows plus its scratch
    row, read by the occurrences of keys without a row (dynamic_shards.ShardRows), all
    zero-initialized (a row is given its initial values when a key is given the row; the scratch
    rows are reset to zeros every step, so they read zeros and their gradients are discarded)."""
    laid_out = copy.copy(table)
    laid_out.vocabulary_size = ShardRows.laid_out_rows(table.vocabulary_size, num_replicas,
                                                       sparse_cores_per_replica)
    laid_out.initializer = tf.zeros_initializer()
    return laid_out


def laid_out_features(feature_config, dynamic_names, table_names, num_replicas,
                      sparse_cores_per_replica):
    """The feature config with every dynamic table replaced by `laid_out_table` (one copy per
    table, shared by its features). table_names: {name: TableConfig} of the feature config."""
    replaced = {id(table): laid_out_table(table, num_replicas, sparse_cores_per_replica)
                for name, table in table_names.items() if name in dynamic_names}

    if not replaced:
        return feature_config

    def replace(feature):   # anything but a FeatureConfig is left for the layout to reject
        if id(getattr(feature, "table", None)) not in replaced:
            return feature
        copied = copy.copy(feature)
        copied.table = replaced[id(feature.table)]
        return copied
    return tf.nest.map_structure(replace, feature_config)


# --------------------------------------------------------------------------------- initial rows
# TensorFlow's and Keras's initializers that new rows can be drawn from, by class name. A random
# row's values are a function of the table's seed and the row's key only
# (ops.key_row_map.keyed_random_rows), so they do not depend on the step, the order of admission
# or the replica that holds the key: a run restored from a checkpoint, on any number of replicas,
# draws the same rows as an uninterrupted one.
_RANDOM = {"TruncatedNormal": "truncated_normal", "RandomNormal": "normal",
           "RandomUniform": "uniform"}
_CONSTANT = ("Zeros", "Ones", "Constant")


def _constant_value(kind, config):
    return 0.0 if kind == "Zeros" else 1.0 if kind == "Ones" else config.get("value")


def check_initializer(table_name, initializer):
    """Fails at construction, naming the table, for an initializer new rows cannot be drawn
    from (anything but a constant or TensorFlow's / Keras's normal and uniform initializers)."""
    kind = type(initializer).__name__
    config = initializer.get_config() if hasattr(initializer, "get_config") else None
    if config is not None and kind in _CONSTANT and np.ndim(_constant_value(kind, config)) == 0:
        return
    if config is not None and kind in _RANDOM:
        return
    raise ValueError(f"table '{table_name}': a dynamic table draws every new row from its "
                     f"initializer, which must be a scalar Constant, Zeros, Ones, "
                     f"TruncatedNormal, RandomNormal or RandomUniform; got {kind}")


def initial_rows(initializer, key_hashes, dim, seed):
    """float32 [k, dim]: the initial values of the rows given to keys with these hashes
    (ops.key_row_map.key_hashes); seed: the table's (an int)."""
    kind = type(initializer).__name__
    config = initializer.get_config()
    if kind in _CONSTANT:
        shape = tf.stack([tf.size(key_hashes), dim])
        return tf.fill(shape, tf.constant(float(_constant_value(kind, config)), tf.float32))
    if kind == "RandomUniform":
        a, b = config.get("minval", -0.05), config.get("maxval", 0.05)
    else:
        a, b = config.get("mean", 0.0), config.get("stddev", 1.0)
    return keyed_random_rows(key_hashes, seed, dim, _RANDOM[kind], a, b)
