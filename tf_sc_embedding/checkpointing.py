"""Topology-independent checkpoints of `TPUEmbeddingV2` through plain `tf.train.Checkpoint`.

What a checkpoint holds, per user table (not per stacked table or replica), under the object path
of the table in the checkpoint (e.g. ``embedding/video`` when the embedding is checkpointed as
``tf.train.Checkpoint(embedding=...)``):

* ``<path>/.ATTRIBUTES/parameters``: the logical ``[vocabulary_size, dim]`` table (unstacked,
  unpadded, unrotated);
* ``<path>/.ATTRIBUTES/<slot>``: each optimizer slot (e.g. ``accumulators``), same shape;
* ``<path>/.ATTRIBUTES/layout``: a JSON string with the layout that was in use (stacked table,
  row offset, rotation, padding, replicas, SparseCores, optimizer), for inspection only.

Nothing depends on the replica count or on stacking, so a checkpoint restores into any topology.

Mechanism. Each user table is a small trackable child of the embedding (`LogicalTable`) saved
with a registered checkpoint saver (`tf.saved_model.experimental`-style `register_checkpoint_saver`)
instead of `_serialize_to_tensors`: TensorFlow's default saver materializes every serialized tensor
of a checkpoint before writing any, i.e. a second copy of *all* tables and slots. The registered
save function instead gathers one logical table at a time (strided copies from zero-copy views of
the shards), writes it with `SaveV2` to its own shard file, and drops it; the files are merged into
the checkpoint by TensorFlow's `MergeV2Checkpoints` with the rest of the user's objects, so a
checkpoint is still one atomic V2 checkpoint (readable with `tf.train.load_checkpoint`). Restore
reads one tensor at a time with `RestoreV2` and writes it into the shards in place.

Deferred restoration: restoring into an embedding that is not built yet validates the checkpoint
(shapes, per table) and remembers where its tables are; `build()` then creates the variables from
the checkpointed values instead of running the initializers, reading one table at a time. The
checkpoint files must still exist when the embedding is built.
"""
import json
import weakref

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.python.checkpoint import checkpoint_management  # noqa: F401  (public API users)
from tensorflow.python.ops import gen_io_ops
from tensorflow.python.saved_model import registration
from tensorflow.python.trackable import base as trackable_base
from tensorflow.python.trackable import trackable_utils
from tensorflow.python.training import py_checkpoint_reader

from tf_sc_embedding import sharded_tables

SAVER_PACKAGE = "tf_sc_embedding"
SAVER_NAME = "LogicalEmbeddingTable"
LAYOUT_KEY = "layout"
PARAMETERS = "parameters"


class LogicalTable(trackable_base.Trackable):
    """Checkpoint node of one user table of a `TPUEmbeddingV2` (values and slots, logical view)."""

    def __init__(self, embedding, table_name, table_config, slot_names):
        self._embedding_ref = weakref.ref(embedding)
        self.table_name = table_name
        self.table_config = table_config
        self.slot_names = tuple(slot_names)

    @property
    def embedding(self):
        return self._embedding_ref()

    @property
    def kinds(self):
        return (PARAMETERS,) + self.slot_names

    @property
    def logical_shape(self):
        return (int(self.table_config.vocabulary_size), int(self.table_config.dim))


def _key(object_name, local_name):
    return trackable_utils.checkpoint_key(object_name, local_name)


def _as_str(prefix):
    if isinstance(prefix, (bytes, str)):
        return prefix.decode() if isinstance(prefix, bytes) else prefix
    if tf.executing_eagerly():
        return prefix.numpy().decode()
    return None


# ------------------------------------------------------------------------------------- saving
def _layout_record(node):
    embedding = node.embedding
    record = {"table": node.table_name, "vocabulary_size": node.logical_shape[0],
              "dim": node.logical_shape[1], "kinds": list(node.kinds), "built": embedding.built}
    if embedding.built:
        placement = embedding._placement(node.table_name)  # pylint: disable=protected-access
        layout = placement.layout
        record.update(
            stacked_table=layout.stacked_table_name, row_offset=layout.sparse_core_shard_row_offset,
            rotation=layout.sparse_core_shard_rotation, padded_height=layout.padded_height,
            padded_width=layout.padded_width,
            rows_per_sparse_core_shard=layout.total_rows_per_sparse_core_shard,
            num_replicas=embedding._num_replicas,  # pylint: disable=protected-access
            sparse_cores_per_replica=embedding._sparse_cores,  # pylint: disable=protected-access
            num_sparse_cores=layout.num_sparse_cores, optimizer=placement.optimizer.definition_name,
            combiner=placement.combiner)
    return json.dumps(record, sort_keys=True)


def _saved_items(node):
    """(kind, nbytes, producer) of the values one node saves now; producer() -> array or tensor."""
    embedding = node.embedding
    height, width = node.logical_shape
    nbytes = 4 * height * width
    if embedding.built:
        return [(kind, nbytes, lambda k=kind: embedding._gather_logical(node.table_name, k))  # pylint: disable=protected-access
                for kind in node.kinds]
    pending = embedding._pending_restore  # pylint: disable=protected-access
    if pending is not None:  # restored but not built yet: carry the restored values forward
        return [(kind, nbytes, lambda k=kind: pending.read(node.table_name, k))
                for kind in node.kinds if pending.has(node.table_name, kind)]
    return []


def _save_fn(trackables, file_prefix):
    """Registered save function: one logical table in memory at a time."""
    prefix = _as_str(file_prefix)
    layouts, items = [], []
    for object_name, node in sorted(trackables.items()):
        layouts.append((_key(object_name, LAYOUT_KEY), _layout_record(node)))
        for kind, nbytes, produce in _saved_items(node):
            items.append((_key(object_name, kind), nbytes, produce))
    # Group small tables into one SaveV2 call while a group stays within the largest single item,
    # so at most one extra copy of the largest table is ever held.
    budget = max([n for _, n, _ in items] + [1])
    groups, current, size = [], [], 0
    for item in items:
        if current and size + item[1] > budget:
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += item[1]
    if current:
        groups.append(current)
    prefixes = []
    with tf.device("CPU:0"):
        names = [k for k, _ in layouts]
        values = [tf.constant(v) for _, v in layouts]
        part = (file_prefix + "_layouts") if prefix is None else prefix + "_layouts"
        gen_io_ops.save_v2(part, names, [""] * len(names), values)
        prefixes.append(tf.convert_to_tensor(part))
        for i, group in enumerate(groups):
            part = (file_prefix + f"_part{i}") if prefix is None else f"{prefix}_part{i}"
            tensors = [sharded_tables.as_tensor_zero_copy(produce())
                       if tf.executing_eagerly() else produce() for _, _, produce in group]
            gen_io_ops.save_v2(part, [k for k, _, _ in group], [""] * len(group), tensors)
            del tensors
            prefixes.append(tf.convert_to_tensor(part))
    return prefixes


# ------------------------------------------------------------------------------------- restoring
class PendingRestore:
    """Where the checkpointed values of a not-yet-built embedding are (read lazily at build)."""

    def __init__(self, prefix, keys):
        self.prefix = prefix
        self.keys = keys   # table name -> {kind: checkpoint key}

    def has(self, table_name, kind):
        return kind in self.keys.get(table_name, {})

    def read(self, table_name, kind):
        """The logical table as a numpy array (one copy, read from the checkpoint file)."""
        key = self.keys[table_name][kind]
        with tf.device("CPU:0"):
            tensor = gen_io_ops.restore_v2(self.prefix, [key], [""], [tf.float32])[0]
        return tensor._numpy()  # pylint: disable=protected-access  (zero-copy view)


def _check_and_collect(trackables, prefix):
    """Validates shapes of every table first (no partial restore); returns per embedding keys."""
    reader = py_checkpoint_reader.NewCheckpointReader(prefix)
    shapes = reader.get_variable_to_shape_map()
    by_embedding = {}
    for object_name, node in sorted(trackables.items()):
        embedding = node.embedding
        if embedding is None:
            continue
        keys = {}
        for kind in node.kinds:
            key = _key(object_name, kind)
            if key not in shapes:
                if kind != PARAMETERS and _key(object_name, PARAMETERS) in shapes:
                    logging.warning("checkpoint %s has no slot '%s' for table '%s': the slot keeps "
                                    "its initial value", prefix, kind, node.table_name)
                continue
            if tuple(shapes[key]) != node.logical_shape:
                raise ValueError(
                    f"table '{node.table_name}': the checkpoint's {kind} has shape "
                    f"[vocabulary_size, dim] = {list(shapes[key])} but the TableConfig has "
                    f"{list(node.logical_shape)} (checkpoint {prefix}, key '{key}'); a table "
                    "with a different vocabulary or dimension cannot be restored")
            keys[kind] = key
        by_embedding.setdefault(id(embedding), (embedding, {}))[1][node.table_name] = keys
    return by_embedding.values()


def _restore_fn(trackables, merged_prefix):
    """Registered restore function: validates everything, then restores one tensor at a time."""
    prefix = _as_str(merged_prefix)
    if prefix is None:
        raise NotImplementedError("restoring a TPUEmbeddingV2 checkpoint inside a tf.function is "
                                  "not supported: restore eagerly")
    for embedding, keys in _check_and_collect(trackables, prefix):
        embedding._restore_logical(PendingRestore(prefix, keys))  # pylint: disable=protected-access


def _is_logical_table(obj):
    return isinstance(obj, LogicalTable)


def _register():
    try:
        registration.register_checkpoint_saver(
            package=SAVER_PACKAGE, name=SAVER_NAME, predicate=_is_logical_table,
            save_fn=_save_fn, restore_fn=_restore_fn)
    except ValueError:  # already registered (module reloaded)
        pass


_register()


# ------------------------------------------------------------------------------------- helpers
def read_saved_layouts(checkpoint_path):
    """The layouts recorded in a checkpoint: {checkpoint key of the table: dict}."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    suffix = "/.ATTRIBUTES/" + LAYOUT_KEY
    return {key[:-len(suffix)]: json.loads(reader.get_tensor(key))
            for key in reader.get_variable_to_shape_map() if key.endswith(suffix)}


def as_numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
