"""Serving export: a SavedModel that looks features up with stock TensorFlow ops only.

`export_serving(embedding, export_dir)` writes the *logical* tables (one plain `tf.Variable` per
user table, no stacking, padding or sharding) and lookup functions built from `tf.gather` and
`tf.math.unsorted_segment_sum`, so the SavedModel loads in any TensorFlow process (and TensorFlow
Serving) without the tf_sc_embedding op library. Combiners and weights follow the training-time
lookup (docs/preprocessing.md#combiners): per sample, ``sum`` is sum(w_i * e_i), ``mean`` divides it by sum(w_i) and
``sqrtn`` by sqrt(sum(w_i^2)); an empty sample gives zeros.

Signatures (flat, for TensorFlow Serving), with ``<f>`` the feature path with non-alphanumeric
characters replaced by ``_``:

* ``serving_default``: inputs ``<f>_ids`` (int64 [n]) and ``<f>_row_splits`` (int64 [batch + 1]),
  a ragged batch per feature; outputs ``<f>``: float32 [batch, dim];
* ``serving_weighted``: the same plus ``<f>_weights`` (float32 [n]).

The loaded object also has ``lookup(features)`` and ``lookup_weighted(features, weights)`` taking
the feature structure of the `FeatureConfig`s with a `tf.RaggedTensor` ([batch, None] int64) per
feature, and ``tables``, a dict of the logical table variables.

An open-vocabulary table (``dynamic_vocabularies``) is written as rows for as many keys as it may
hold plus one zero row, and a stock mutable hash table from each held key to its row: a key the
table does not hold reads the zero row (so ``mean`` counts it, as in training). Its features take
``tf.string`` or int64 keys (``<f>_ids`` of the table's key dtype); ``key_tables`` maps the
table's name to its hash table.

``apply_delta(path)`` applies a delta of the embedding's (`TPUEmbeddingV2.export_delta`) in
place, with stock ops (serving_deltas.py): the deltas written after this export, in order.

With ``quantize="int8"`` each table is stored as int8 codes with a float32 scale and offset per row
and dequantized in the lookup (serving_rows.py has the rule and its error bound); ``tables`` then
maps each table name to an object with the variables ``codes``, ``scales`` and ``offsets``.
"""
import re

import tensorflow as tf

import numpy as np

from tf_sc_embedding import private_tf
from tf_sc_embedding.saving import serving_deltas
from tf_sc_embedding.tables.layout import table_names as config_table_names
from tf_sc_embedding.saving.serving_rows import Float32Rows, check_quantization, stored_rows


def _flat_name(path):
    return re.sub(r"[^A-Za-z0-9]", "_", path)


def combine(table, ids, row_splits, weights, combiner):
    """Stock-op lookup of a ragged batch: [batch, dim] activations with a combiner. `table` is a
    tensor or variable of rows, or an object whose `gather(ids)` reads them (serving_rows.py)."""
    ids = tf.cast(ids, tf.int64)
    row_splits = tf.cast(row_splits, tf.int64)
    num_rows = tf.shape(row_splits, out_type=tf.int64)[0] - 1
    segments = tf.ragged.row_splits_to_segment_ids(row_splits)
    if weights is None:
        weights = tf.ones(tf.shape(ids), tf.float32)
    weights = tf.cast(weights, tf.float32)
    rows = table.gather(ids) if hasattr(table, "gather") else tf.gather(table, ids)
    summed = tf.math.unsorted_segment_sum(rows * weights[:, None], segments, num_rows)
    if combiner == "sum":
        return summed
    if combiner == "mean":
        scale = tf.math.unsorted_segment_sum(weights, segments, num_rows)
    else:  # sqrtn
        scale = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, segments, num_rows))
    return tf.math.divide_no_nan(summed, scale[:, None])


class ServingModule(tf.Module):
    """Logical tables as plain variables and stock-op lookup functions (see the module doc)."""

    def __init__(self, logical_tables, feature_config, table_names, quantize=None,
                 dynamic_tables=None, deltas=None):
        """dynamic_tables: {table name: (keys, values, capacity)} of the open-vocabulary tables,
        keys ascending (export_dynamic_table); logical_tables: {name: [vocabulary_size, dim]} of
        the others. deltas: (position, parts, {table: info}) of the embedding's delta stream
        (DeltaStream.serving_info), or None when it tracks none."""
        super().__init__(name="embedding_serving")
        dynamic_tables = dynamic_tables or {}
        logical_tables = dict(logical_tables)
        for name, (keys, values, capacity) in dynamic_tables.items():
            # Rows for every key the table may hold, then the zero row of unknown keys.
            rows = np.zeros((capacity + 1, values.shape[1]), np.float32)
            rows[:len(keys)] = values
            logical_tables[name] = rows
        # Plain variables, not mirrored by a tf.distribute scope the caller may be in.
        self.rows = {name: stored_rows(value, name, quantize)
                     for name, value in logical_tables.items()}
        self.tables = {name: rows.values if isinstance(rows, Float32Rows) else rows
                       for name, rows in self.rows.items()}
        self.dynamic_rows = {name: serving_deltas.DynamicRows(keys, capacity, _key_dtype(keys))
                             for name, (keys, _, capacity) in dynamic_tables.items()}
        self.key_tables = {name: rows.table for name, rows in self.dynamic_rows.items()}
        position, self.delta_parts, self.delta_tables = deltas or ("", 1, {})
        with tf.device("CPU:0"):
            self.delta_position = tf.Variable(position, trainable=False, name="delta_position")
        self.apply_delta = tf.function(lambda path: serving_deltas.apply_delta(self, path),
                                       input_signature=[tf.TensorSpec([], tf.string)])
        self._feature_config = feature_config
        flat = private_tf.flatten_with_joined_string_paths(feature_config)
        self._features = [(path, table_names[id(feature.table)], feature.table.combiner)
                          for path, feature in flat]
        names = [_flat_name(p) for p, _, _ in self._features]
        if len(set(names)) != len(names):
            raise ValueError(f"feature paths collide once flattened for the signature: {names}")
        key_dtypes = [self.key_tables[t].key_dtype if t in self.key_tables else tf.int64
                      for _, t, _ in self._features]
        ragged = tf.nest.pack_sequence_as(feature_config, [
            tf.RaggedTensorSpec([None, None], dtype, ragged_rank=1) for dtype in key_dtypes])
        weights = tf.nest.map_structure(
            lambda _: tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1),
            feature_config)
        self.lookup = tf.function(self._lookup, input_signature=[ragged])
        self.lookup_weighted = tf.function(self._lookup_weighted,
                                           input_signature=[ragged, weights])
        ids = {f"{n}_ids": tf.TensorSpec([None], dtype, name=f"{n}_ids")
               for n, dtype in zip(names, key_dtypes)}
        splits = {f"{n}_row_splits": tf.TensorSpec([None], tf.int64, name=f"{n}_row_splits")
                  for n in names}
        self.serving_default = tf.function(self._serving, input_signature=[{**ids, **splits}])
        self.serving_weighted = tf.function(self._serving, input_signature=[{
            **ids, **splits,
            **{f"{n}_weights": tf.TensorSpec([None], tf.float32, name=f"{n}_weights")
               for n in names}}])

    def _row_ids(self, table, ids):
        """The rows of a feature's ids: a dynamic table's keys through its hash table."""
        key_table = self.key_tables.get(table)
        return ids if key_table is None else key_table.lookup(ids)

    def _lookup_flat(self, flat_ids, flat_weights):
        out = []
        for (_, table, combiner), ids, weights in zip(self._features, flat_ids, flat_weights):
            out.append(combine(self.rows[table], self._row_ids(table, ids.values),
                               ids.row_splits, None if weights is None else weights.values,
                               combiner))
        return tf.nest.pack_sequence_as(self._feature_config, out)

    def _lookup(self, features):
        flat = tf.nest.flatten(features)
        return self._lookup_flat(flat, [None] * len(flat))

    def _lookup_weighted(self, features, weights):
        return self._lookup_flat(tf.nest.flatten(features), tf.nest.flatten(weights))

    def _serving(self, inputs):
        out = {}
        for path, table, combiner in self._features:
            n = _flat_name(path)
            out[n] = combine(self.rows[table], self._row_ids(table, inputs[f"{n}_ids"]),
                             inputs[f"{n}_row_splits"], inputs.get(f"{n}_weights"), combiner)
        return out


def _key_dtype(keys):
    keys = np.asarray(keys)
    return tf.string if keys.dtype == object or keys.dtype.kind in "SU" else tf.int64


def serving_module(embedding, quantize=None):
    """A `ServingModule` holding a copy of the embedding's current logical tables (quantized
    with `quantize`: None or "int8")."""
    check_quantization(quantize)
    names = {id(table): name
             for name, table in config_table_names(embedding.feature_config).items()}
    dynamic = embedding.dynamic_tables
    deltas = embedding.deltas
    with tf.init_scope():
        return ServingModule(
            embedding.logical_tables(as_numpy=quantize is not None), embedding.feature_config,
            names, quantize, {name: embedding.export_dynamic_table(name) +
                              (dynamic.table(name).capacity,) for name in dynamic.names},
            deltas.serving_info() if deltas is not None else None)


def export_serving(embedding, export_dir, quantize=None):
    """Writes the serving SavedModel to export_dir; returns the `ServingModule` it saved.

    quantize: None (float32 tables) or "int8" (int8 rows with a per-row scale and offset)."""
    module = serving_module(embedding, quantize)
    tf.saved_model.save(module, export_dir, signatures={
        "serving_default": module.serving_default.get_concrete_function(),
        "serving_weighted": module.serving_weighted.get_concrete_function()})
    return module
