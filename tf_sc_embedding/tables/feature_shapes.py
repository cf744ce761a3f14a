"""The per-replica shape of a feature's samples: the one home of the rule.

Ragged and sparse ids, and 1-D dense ids, are one sample per row: the feature's samples have shape
[batch]. Dense ids of shape [batch, n, ...] are n x ... one-id samples per row, shaped
[batch, n, ...], and their activations [batch, n, ..., dim], as in TensorFlow. The tables' layout
is fixed by these shapes, so they must be static when the tables are built.
"""
import tensorflow as tf


def _is_composite(feature):
    """Ragged or sparse ids (tensors, or Keras's symbolic inputs flagged ragged / sparse)."""
    return (isinstance(feature, (tf.RaggedTensor, tf.SparseTensor)) or
            bool(getattr(feature, "ragged", False)) or bool(getattr(feature, "sparse", False)))


def _static_rows(feature):
    shape = tf.TensorShape(feature.shape)
    rows = shape[0] if shape.rank else None
    if rows is None and isinstance(feature, tf.SparseTensor):
        value = tf.get_static_value(feature.dense_shape)
        rows = None if value is None else int(value[0])
    return rows


def sample_dims(feature):
    """(rows or None, the dimensions after the batch) of a feature's ids, as far as they are
    static. `feature`: a tensor, ragged or sparse tensor, or Keras symbolic input."""
    if _is_composite(feature):
        return _static_rows(feature), []
    if not hasattr(feature, "shape"):
        feature = tf.convert_to_tensor(feature)
    shape = tf.TensorShape(feature.shape)
    if shape.rank is None or shape.rank == 0:
        return None, []
    dims = shape.as_list()
    return dims[0], dims[1:]


def sample_shape(path, feature, batch=None):
    """The static per-replica sample shape of a feature's ids (`batch` replaces the rows).

    Raises ValueError naming the feature when a dimension is not static.
    """
    rows, inner = sample_dims(feature)
    rows = rows if batch is None else batch
    if None in inner:
        raise ValueError(f"feature '{path}': dense ids need static dimensions after the batch, "
                         f"got shape {tuple(feature.shape)}")
    if rows is None:
        raise ValueError(f"feature '{path}': the batch size is not static, so the tables cannot "
                         "be laid out; call build(per_replica_batch_size=...) (EmbeddingLayer: "
                         "batch_size=, the global batch), set the FeatureConfig's output_shape, "
                         "or batch the dataset with drop_remainder=True")
    return tuple(int(d) for d in [rows] + inner)


def configured_shape(path, feature_config, per_replica_batch_size=None):
    """The sample shape a FeatureConfig fixes (its output_shape), else [per_replica_batch_size]."""
    if feature_config.output_shape.rank:
        return tuple(int(d) for d in feature_config.output_shape.as_list())
    if per_replica_batch_size is None:
        raise ValueError(f"feature '{path}': no output_shape in its FeatureConfig; pass "
                         "per_replica_batch_size to build()")
    return (int(per_replica_batch_size),)


def flatten_like(structure, value, what, allow_none=False):
    """tf.nest.flatten of `value`, which must have the structure of `structure` (the feature
    config): a clear error naming `what` otherwise."""
    try:
        tf.nest.assert_same_structure(structure, value)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{what} must have the same structure as feature_config: {e}") from None
    flat = tf.nest.flatten(value)
    if not allow_none and any(x is None for x in flat):
        raise ValueError(f"{what} contains None")
    return flat


def check_same_kind(path, ids, other, what):
    """Raises ValueError naming the feature unless `other` is a batch like `ids`: the same kind
    (dense, ragged or sparse), per-replica sample dimensions and dtype."""
    same = (type(ids) is type(other) and  # pylint: disable=unidiomatic-typecheck
            tf.as_dtype(ids.dtype) == tf.as_dtype(other.dtype) and
            sample_dims(ids) == sample_dims(other))
    if not same:
        raise ValueError(
            f"feature '{path}': {what} must be a batch like features (same kind, per-replica "
            f"shape and dtype); got {type(ids).__name__} {ids.dtype} {tuple(ids.shape)} and "
            f"{type(other).__name__} {other.dtype} {tuple(other.shape)}")


def per_replica_shapes(feature_config, paths, per_replica_batch_size, output_shapes,
                       flatten_up_to, sparse_cores, num_replicas):
    """{flat path: sample shape} that build() lays the tables out for: each feature's given
    output shape, else its configured shape. Raises ValueError naming a feature whose samples do
    not split evenly over the replica's SparseCores. flatten_up_to: tf.nest's (private_tf)."""
    flat_features = tf.nest.flatten(feature_config)
    given = (flatten_up_to(feature_config, output_shapes) if output_shapes is not None
             else [None] * len(flat_features))
    shapes = {}
    for path, feature, shape in zip(paths, flat_features, given):
        shapes[path] = (configured_shape(path, feature, per_replica_batch_size)
                        if shape is None else tuple(int(d) for d in shape))
        count = int(tf.TensorShape(shapes[path]).num_elements())
        if count % sparse_cores:
            raise ValueError(
                f"feature '{path}': the per-replica batch ({count} samples) must be divisible by "
                f"the SparseCores per replica ({sparse_cores}); the global batch must be "
                f"divisible by replicas x SparseCores ({num_replicas} x {sparse_cores})")
    return shapes


def flatten_batch(feature_config, features, weights, what="features"):
    """(flat ids, flat weights or Nones) of a batch, checked against the feature config."""
    flat = flatten_like(feature_config, features, what)
    flat_weights = ([None] * len(flat) if weights is None else
                    flatten_like(feature_config, weights, what.replace("features", "weights"),
                                 allow_none=True))
    return flat, flat_weights


def has_distributed_values(*structures):
    """Whether any of the structures holds a per-replica (`tf.distribute`) value."""
    return any(isinstance(v, tf.distribute.DistributedValues)
               for structure in structures if structure is not None
               for v in ([structure] if isinstance(structure, tf.distribute.DistributedValues)
                         else tf.nest.flatten(structure)))
