"""Wire precision: the dtype in which an all-to-all's float payload travels between replicas.

With `EmbeddingOptions(wire_precision="16bit")` the rows an owner sends back in the forward pass
travel as float16 and the gradient rows sent to the owners as bfloat16 (TorchRec's recommended
quantized communication): half the bytes of the two large all-to-alls of a step. Both casts
round to nearest even, so the bits do not depend on the transport, the thread count or the
order of the workers; the receiver widens the payload back to float32 at once, and everything
else (combiners, the fused update, the tables) stays float32. float16 carries rows whose values
stay within +-65504 (beyond, a value arrives as +-inf and the step's non-finite check names
it); bfloat16 keeps float32's range for gradients with 8 bits of mantissa.

An exchange names what a payload is (`ROWS`, `GRADIENTS`) and the replica view applies the rule;
payloads it does not name (ids, keys, counts, ids carried in float columns) always travel exactly.
"""
import tensorflow as tf

WIRE_PRECISIONS = ("float32", "16bit")
ROWS = "rows"
GRADIENTS = "gradients"
_SIXTEEN_BIT = {ROWS: tf.float16, GRADIENTS: tf.bfloat16}


def wire_dtype(precision, payload):
    """The dtype a float32 payload of kind `payload` travels in, or None to send it as it is."""
    if precision == "float32" or payload is None:
        return None
    if precision != "16bit":
        raise ValueError(f"wire_precision must be one of {WIRE_PRECISIONS}, got {precision!r}")
    return _SIXTEEN_BIT[payload]


def on_the_wire(send, value, precision, payload):
    """send(value) with the float32 payload narrowed to its wire dtype and widened back."""
    dtype = wire_dtype(precision, payload)
    if dtype is None or value.dtype != tf.float32:
        return send(value)
    return tf.cast(send(tf.cast(value, dtype)), tf.float32)
