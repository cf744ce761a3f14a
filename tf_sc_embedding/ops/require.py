"""`require`: the library's checks inside a step, as a stateless op (cc/ops/require_ops.cc).

`tf.debugging.Assert` and the `assert_*` functions are stateful ops without a resource input,
which TensorFlow's automatic control dependencies run in program order over a whole
`tf.function`. Under MirroredStrategy that function holds every replica's step one after the
other, so such a check on the way into one replica's collectives waits for any such op another
replica runs after its own collectives (a `tf.print` in the user's dense model is enough), and
the step deadlocks (docs/multi_worker.md#in-step-checks). `require` fails the same way
(InvalidArgument, the caller's message) without joining that chain.
"""
import tensorflow as tf

from tf_sc_embedding._library import library as _lib


def require(condition, values, message):
    """`values` (a list of tensors) unchanged once every element of `condition` (bool) holds;
    otherwise InvalidArgumentError(message). Consume the returned tensors, not `values`: the
    check runs because they depend on it."""
    return _lib.sce_require(condition=tf.convert_to_tensor(condition, tf.bool),
                            values=list(values), message=message)
