"""How a serving export stores a logical table's rows, and reads them back with stock ops.

* `Float32Rows`: the logical table as one float32 variable (the default).
* `Int8Rows` (`export_serving(..., quantize="int8")`): each row as int8 codes with one float32
  scale and offset per row (asymmetric, per row, like FBGEMM's 8-bit row-wise tables), so a table
  of dim D costs D + 8 bytes per row instead of 4 D (at dim 32: 40 bytes instead of 128).
  A row with minimum lo and maximum hi gets scale = (hi - lo) / 255 and
  code = round((x - lo) / scale) - 128, in [-128, 127]; it is read back as
  code * scale + offset with offset = lo + 128 * scale, so every value is within scale / 2 of
  the trained one, plus the float32 rounding of the offset and of the read-back arithmetic (which
  matters for a row whose values are far from 0 compared with their range). A constant row gets
  scale 0 and is read back exactly.

Both read with `gather(ids)` built from `tf.gather`, `tf.cast` and arithmetic only, so the
SavedModel loads without this library. Quantizing runs over chunks of rows, so it needs memory
for one chunk beyond the result.
"""
import numpy as np
import tensorflow as tf

from tf_sc_embedding import private_tf

QUANTIZATIONS = (None, "int8")
_CHUNK_ROWS = 1 << 18
_LEVELS = 255.0


def check_quantization(quantize):
    """Raises ValueError unless `quantize` is one of QUANTIZATIONS (checked before any table is
    read: with several workers reading the tables is a collective)."""
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"export_serving: quantize must be one of {QUANTIZATIONS}, got "
                         f"{quantize!r}")


class Float32Rows(tf.Module):
    """A logical table as one plain float32 variable."""

    def __init__(self, values, name):
        super().__init__(name=None)
        self.values = private_tf.plain_variable(values, name=name)

    def gather(self, ids):
        """The rows of `ids` as float32, exactly as trained."""
        return tf.gather(self.values, ids)

    def numpy(self):
        return self.values.numpy()

    def scatter(self, ids, values):
        """Writes float32 rows at `ids` (a delta, serving_deltas.py)."""
        return self.values.scatter_update(tf.IndexedSlices(values, ids))


def quantize_int8(values, name="table"):
    """(codes int8 [n, d], scales float32 [n, 1], offsets float32 [n, 1]) of float32 rows.

    Per row, so that one row's range (a popular id's large values) does not cost the precision
    of every other row; `name` is the table, for errors.
    """
    values = np.asarray(values, np.float32)
    codes = np.empty(values.shape, np.int8)
    scales = np.empty((values.shape[0], 1), np.float32)
    offsets = np.empty((values.shape[0], 1), np.float32)
    for first in range(0, values.shape[0], _CHUNK_ROWS):
        rows = values[first:first + _CHUNK_ROWS]
        if not np.all(np.isfinite(rows)):
            raise ValueError(f"table '{name}': the int8 serving export cannot quantize NaN or "
                             "Inf values")
        low = rows.min(axis=1, keepdims=True) if rows.shape[1] else np.zeros((len(rows), 1))
        high = rows.max(axis=1, keepdims=True) if rows.shape[1] else low
        scale = ((high.astype(np.float64) - low) / _LEVELS).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1.0))
        code = np.rint((rows - low) / safe) - 128.0
        codes[first:first + len(rows)] = np.clip(code, -128, 127).astype(np.int8)
        scales[first:first + len(rows)] = scale
        offsets[first:first + len(rows)] = low + np.float32(128.0) * scale
    return codes, scales, offsets


class Int8Rows(tf.Module):
    """A logical table as int8 codes with a float32 scale and offset per row."""

    def __init__(self, values, name):
        super().__init__(name=None)
        codes, scales, offsets = quantize_int8(values, name)
        self.codes = private_tf.plain_variable(codes, name=f"{name}/codes")
        self.scales = private_tf.plain_variable(scales, name=f"{name}/scales")
        self.offsets = private_tf.plain_variable(offsets, name=f"{name}/offsets")

    def gather(self, ids):
        """The rows of `ids` dequantized to float32 (three gathers: codes, scales, offsets)."""
        codes = tf.cast(tf.gather(self.codes, ids), tf.float32)
        return codes * tf.gather(self.scales, ids) + tf.gather(self.offsets, ids)

    def scatter(self, ids, values):
        """Quantizes float32 rows (quantize_int8_tf) and writes them at `ids`."""
        codes, scales, offsets = quantize_int8_tf(values)
        return tf.group(self.codes.scatter_update(tf.IndexedSlices(codes, ids)),
                        self.scales.scatter_update(tf.IndexedSlices(scales, ids)),
                        self.offsets.scatter_update(tf.IndexedSlices(offsets, ids)))

    def numpy(self):
        """The rows as the export reads them back (dequantized)."""
        return self.codes.numpy().astype(np.float32) * self.scales.numpy() + self.offsets.numpy()


def quantize_int8_tf(rows):
    """quantize_int8 with stock ops, bit for bit (float64 scale, round half to even), for the
    rows a delta brings to a live serving model."""
    low = tf.reduce_min(rows, axis=1, keepdims=True)
    high = tf.reduce_max(rows, axis=1, keepdims=True)
    scale = tf.cast((tf.cast(high, tf.float64) - tf.cast(low, tf.float64)) / _LEVELS, tf.float32)
    safe = tf.where(scale > 0, scale, tf.ones_like(scale))
    code = tf.round((rows - low) / safe) - 128.0
    codes = tf.cast(tf.clip_by_value(code, -128.0, 127.0), tf.int8)
    return codes, scale, low + 128.0 * scale


def stored_rows(values, name, quantize):
    """The serving storage of one logical table for a `quantize` of QUANTIZATIONS."""
    check_quantization(quantize)
    if quantize == "int8":
        return Int8Rows(np.asarray(values), name)
    return Float32Rows(values, name)
