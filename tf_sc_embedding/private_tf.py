"""The private TensorFlow APIs the library cannot do without, each with the reason, in one place.

This is the only module of the library (and of its tests, benchmarks and examples) that imports
`tensorflow.python`; `tests/test_private_apis.py` enforces it. A TensorFlow upgrade that moves one
of these breaks here, with a clear import error, and nowhere else. The TensorFlow version is pinned
(requirements.txt) and checked at import (`_library.py`).

What is wrapped, and why no public API serves:

* Checkpointing (`checkpointing.py`, `table_storage.py`):
  - `Trackable` (`tensorflow.python.trackable.base`): the base of a checkpoint node that saves
    through `_serialize_to_tensors`. `tf.Module` / `tf.train.Checkpoint` objects only save
    variables they hold; a table's parameters and slots are not held as one variable (they are
    stacked and sharded) but must appear under TensorFlow's names. (`tf.__internal__.tracking`
    exposes the same class, with no more promise of stability.)
  - `register_checkpoint_saver` (`tensorflow.python.saved_model.registration`): the public
    Checkpoint API materializes every tensor of every object before writing any, which would
    double the memory of large tables; a registered saver writes one piece at a time.
  - `SaveSpec` (`tensorflow.python.training.saving.saveable_object`): a value recorded in the
    object graph that TensorFlow's saver does not write (the registered saver writes it).
  - `checkpoint_key`, `escape_local_name` (`tensorflow.python.trackable.trackable_utils`): the
    exact key TensorFlow gives a node's attribute ("a/.ATTRIBUTES/VARIABLE_VALUE", with "/" and
    "." escaped), so checkpoints restore into TensorFlow's own embedding and back.
  - `ShardInfo` (`tensorflow.python.trackable.base`): the argument through which TensorFlow's
    initializers compute one shard of a partitioned variable; passing it lets a table be
    initialized one chunk of rows at a time.
  - `restore_uid` (`Trackable._update_uid`): the id of the restore that last reached a node.
    TensorFlow hands each node of a checkpoint its part separately and calls registered restore
    functions last, with no call that marks where a restore begins or ends; an open-vocabulary
    table's node holds its checked state until the embedding's restore function imports it, and
    the id tells that function which held states belong to the restore running now (one left
    by a restore that failed elsewhere must not be imported by a later one).
* Variables outside a distribution strategy: `uninitialized_variable`, `plain_variable`,
  `shapeless_variable` (`tensorflow.python.ops.resource_variable_ops`). `tf.Variable` created under
  `strategy.scope()` becomes a mirrored variable (one copy per replica, kept in sync); table
  shards, per-replica counters and per-step buffers are per-device state, and the serving export
  must hold plain variables whatever scope the caller is in. There is no public way to step out
  of the strategy's variable creator.
* `numpy_view`: `EagerTensor._numpy()`, a zero-copy view; `Tensor.numpy()` copies.
* `call_time_int32`: `FuncGraph.capture_call_time_value`, a value computed on every call of a
  `tf.function` (what `tf.distribute` itself uses for fresh collective instance keys).
* Nested structures, in `tf.nest`'s order (the order TensorFlow's `TPUEmbeddingV2` uses):
  `flatten_up_to` and `flatten_with_joined_string_paths` (`tensorflow.python.util.nest`).
  `tf.nest` exports neither. `keras.tree` has `flatten_with_path` and `map_structure_up_to` but
  orders an `OrderedDict` by insertion where `tf.nest` sorts its keys, and names a namedtuple's
  children by field where `tf.nest` numbers them, so it cannot give TensorFlow's feature order and
  paths (and the core of the library does not import Keras).
"""
# pylint: disable=protected-access
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.saved_model import registration as _registration
from tensorflow.python.trackable import base as _trackable_base
from tensorflow.python.trackable import trackable_utils as _trackable_utils
from tensorflow.python.training.saving import saveable_object as _saveable_object
from tensorflow.python.util import nest as _nest

# ---------------------------------------------------------------------------- checkpointing
Trackable = _trackable_base.Trackable
ShardInfo = _trackable_base.ShardInfo
SaveSpec = _saveable_object.SaveSpec
register_checkpoint_saver = _registration.register_checkpoint_saver
checkpoint_key = _trackable_utils.checkpoint_key
escape_local_name = _trackable_utils.escape_local_name


def restore_uid(trackable):
    """The id of the last restore that reached `trackable` (TensorFlow sets it on every node of
    a restore before any restore function runs)."""
    return trackable._update_uid


# ------------------------------------------------------------------------------- variables
def uninitialized_variable(shape, dtype, name):
    """A resource variable created outside any distribution strategy's variable creator.

    `tf.Variable` inside `strategy.scope()` would become a mirrored variable on every replica;
    table shards are per-replica state and must be plain variables on one device each.
    """
    return _resource_variable_ops.UninitializedVariable(shape=shape, dtype=dtype, name=name,
                                                        trainable=False)


def plain_variable(initial_value, name):
    """A plain resource variable (not mirrored, not trainable), e.g. per-replica counters or the
    tables of the serving export."""
    return _resource_variable_ops.ResourceVariable(initial_value, name=name, trainable=False)


def shapeless_variable(initial_value, name):
    """A plain resource variable whose shape may change with every assignment (kept per-step
    buffers of varying size; `tf.Variable(shape=None)` under a strategy scope would mirror it)."""
    return _resource_variable_ops.ResourceVariable(initial_value, name=name, trainable=False,
                                                   shape=tf.TensorShape(None))


# --------------------------------------------------------------------------------- tensors
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
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    if not tf.executing_eagerly() and getattr(graph, "building_function", False):
        with graph.as_default():
            return graph.capture_call_time_value(fn, tf.TensorSpec([], tf.int32))
    with tf.device("CPU:0"):
        return tf.constant(fn(), tf.int32)


# ------------------------------------------------------------------------ nested structures
def flatten_up_to(shallow_structure, structure):
    """`structure` flattened down to the leaves of `shallow_structure`, in tf.nest order.

    tf.nest exports no flatten_up_to: per-feature shapes are lists, which tf.nest.flatten would
    flatten too. (keras.tree has map_structure_up_to but no flatten_up_to, and the core of the
    library does not import Keras.)
    """
    return _nest.flatten_up_to(shallow_structure, structure)


def flatten_with_joined_string_paths(structure):
    """[(path, leaf)] in tf.nest.flatten order, each path its keys / indices joined with "/".

    tf.nest exports no paths. keras.tree.flatten_with_path orders an OrderedDict by insertion
    (tf.nest sorts its keys) and names namedtuple children by field (tf.nest numbers them), so its
    paths would not match the feature order and names TensorFlow's TPUEmbeddingV2 uses.
    """
    return _nest.flatten_with_joined_string_paths(structure)
