"""The all-or-nothing check of activation gradients (docs/optimizers.md#non-finite-gradients).

`TPUEmbeddingV2.apply_gradients` marks every feature whose activation gradient has a NaN or Inf,
agrees the marks across replicas (with an all-gather, or inside the all-to-all of the gradient
rows), and passes them here before any update: one marked feature anywhere fails the step on
every replica, naming each marked feature and its table, before any table or slot is written.
"""
import tensorflow as tf

from tf_sc_embedding._library import library as _lib


def non_finite_flags(gradients):
    """int32 [len(gradients)]: 1 where a gradient has a NaN or Inf (None counts as finite).

    One op: a vectorized pass over each gradient's bits, the gradients in parallel.
    """
    values = [tf.zeros([0], tf.float32) if g is None else tf.cast(g, tf.float32)
              for g in gradients]
    return _lib.sce_non_finite_flags(values=values)


def require_finite_gradients(non_finite, values, feature_names, table_names, name=None):
    """`values` unchanged, or InvalidArgumentError naming each feature marked in `non_finite`.

    Pass what the rest of the step consumes as `values` (the gradients, or the updates' inputs
    after the gradient exchange): the check then runs before any of it. The op is stateless, so TensorFlow's automatic control dependencies do not
    chain it with the collectives of other replicas (see cc/ops/gradient_check_ops.cc).
    """
    return _lib.sce_require_finite_gradients(
        non_finite=non_finite, values=list(values), feature_names=list(feature_names),
        table_names=list(table_names), name=name)
