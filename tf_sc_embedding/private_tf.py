"""The private TensorFlow APIs the library cannot do without, each with the reason, in one place.

Every other module uses public TensorFlow only and reaches these through this module, so a
TensorFlow upgrade that moves one of them breaks here, with a clear import error, and nowhere else.
The TensorFlow version is pinned (requirements.txt) and checked at import (`_library.py`).
"""
# pylint: disable=protected-access
import tensorflow as tf
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.util import nest as _nest
from tensorflow.python.saved_model import registration as _registration
from tensorflow.python.trackable import base as _trackable_base
from tensorflow.python.trackable import trackable_utils as _trackable_utils
from tensorflow.python.trackable.base import ShardInfo  # noqa: F401  (initializer argument type)

# Checkpoint nodes that save themselves through a registered saver: the public Checkpoint API has
# no way for an object to write its tensors one at a time (the default path materializes every
# tensor of every object before writing any), which would double the memory of large tables.
Trackable = _trackable_base.Trackable
register_checkpoint_saver = _registration.register_checkpoint_saver
checkpoint_key = _trackable_utils.checkpoint_key
escape_local_name = _trackable_utils.escape_local_name
# A value recorded in the object graph that TensorFlow's saver does not write (callable -> None).
from tensorflow.python.training.saving.saveable_object import SaveSpec  # noqa: E402,F401


def uninitialized_variable(shape, dtype, name):
    """A resource variable created outside any distribution strategy's variable creator.

    `tf.Variable` inside `strategy.scope()` would become a mirrored variable on every replica;
    table shards are per-replica state and must be plain variables on one device each.
    """
    return resource_variable_ops.UninitializedVariable(shape=shape, dtype=dtype, name=name,
                                                       trainable=False)


def plain_variable(initial_value, name):
    """A plain resource variable (not mirrored), e.g. per-replica counters."""
    return resource_variable_ops.ResourceVariable(initial_value, name=name, trainable=False)


def shapeless_variable(initial_value, name):
    """A plain resource variable whose shape may change with every assignment (kept per-step
    buffers of varying size; `tf.Variable(shape=None)` under a strategy scope would mirror it)."""
    return resource_variable_ops.ResourceVariable(initial_value, name=name, trainable=False,
                                                  shape=tf.TensorShape(None))


def numpy_view(eager_tensor):
    """A zero-copy numpy view of an eager tensor's buffer.

    `Tensor.numpy()` copies; tables are read and written in place through views to avoid a second
    copy of a table that may be most of the host's memory.
    """
    return eager_tensor._numpy()


def call_time_int32(fn):
    """An int32 scalar that `fn()` computes each time the enclosing tf.function is called.

    Collective instance keys must be fresh for every execution (TensorFlow caches an instance's
    shapes by key); `tf.distribute` does the same through this FuncGraph method. Eagerly, fn()
    is simply called.
    """
    graph = _ops.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    if not tf.executing_eagerly() and getattr(graph, "building_function", False):
        with graph.as_default():
            return graph.capture_call_time_value(fn, tf.TensorSpec([], tf.int32))
    with tf.device("CPU:0"):
        return tf.constant(fn(), tf.int32)


def flatten_up_to(shallow_structure, structure):
    """tf.nest has no public flatten_up_to: per-feature shapes are lists, which tf.nest.flatten
    would flatten too."""
    return _nest.flatten_up_to(shallow_structure, structure)
