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

Restoring reads every table in chunks of rows (`RestoreV2` with slices), and each process keeps
only the rows its replicas hold: under MultiWorkerMirroredStrategy every worker reads only what
it owns. Saving under MultiWorkerMirroredStrategy follows TensorFlow's convention (every worker
calls `save`, the chief with the real path): each table is gathered from all workers during the
save, one table at a time, so the chief's checkpoint is complete.

Deferred restoration: restoring into an embedding that is not built yet validates the checkpoint
(shapes, per table) and remembers where its tables are; `build()` then creates the variables from
the checkpointed values instead of running the initializers, reading one chunk at a time. The
checkpoint files must still exist when the embedding is built.

Before anything is written, every table's shapes are checked, every slot the configured
optimizer needs must be present (unless `allow_optimizer_change()` is active, in which case
missing slots keep their initial values), and the last row of every tensor is read (a truncated
data file fails here, naming the table, not half-way through a restore).
"""
import contextlib
import json
import threading
import weakref

import tensorflow as tf
from absl import logging

from tf_sc_embedding import private_tf
from tf_sc_embedding.table_storage import PARAMETERS, as_tensor_zero_copy

SAVER_PACKAGE = "tf_sc_embedding"
SAVER_NAME = "LogicalEmbeddingTable"
LAYOUT_KEY = "layout"

_options = threading.local()


@contextlib.contextmanager
def allow_optimizer_change():
    """Restores inside this block accept checkpoints without some optimizer slots.

    Use it when the optimizer was changed deliberately between saving and restoring: the slots
    the checkpoint does not have keep their initial values (a warning names each). Without it, a
    missing slot is an error and nothing is restored.
    """
    previous = getattr(_options, "allow_missing_slots", False)
    _options.allow_missing_slots = True
    try:
        yield
    finally:
        _options.allow_missing_slots = previous


class LogicalTable(private_tf.Trackable):
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
    return private_tf.checkpoint_key(object_name, local_name)


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
        storage = embedding.storage
        placement = storage.placement(node.table_name)
        layout = placement.layout
        record.update(
            stacked_table=layout.stacked_table_name, row_offset=layout.sparse_core_shard_row_offset,
            rotation=layout.sparse_core_shard_rotation, padded_height=layout.padded_height,
            padded_width=layout.padded_width,
            rows_per_sparse_core_shard=layout.total_rows_per_sparse_core_shard,
            num_replicas=storage.num_replicas, sparse_cores_per_replica=storage.sparse_cores,
            num_sparse_cores=layout.num_sparse_cores, optimizer=placement.optimizer.definition_name,
            combiner=placement.combiner)
    return json.dumps(record, sort_keys=True)


def _saved_items(node):
    """(kind, nbytes, producer) of the values one node saves now; producer() -> array or tensor."""
    embedding = node.embedding
    height, width = node.logical_shape
    nbytes = 4 * height * width
    if embedding.built:
        return [(kind, nbytes, lambda k=kind: embedding.read_logical(node.table_name, k))
                for kind in node.kinds]
    items = []   # restored but not built yet: carry the restored values forward
    for kind in node.kinds:
        pending = embedding.pending_restore(node.table_name, kind)
        if pending is not None:
            items.append((kind, nbytes, lambda p=pending: p(0, height) if callable(p) else p))
    return items


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
        tf.raw_ops.SaveV2(prefix=part, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=values)
        prefixes.append(tf.convert_to_tensor(part))
        for i, group in enumerate(groups):
            part = (file_prefix + f"_part{i}") if prefix is None else f"{prefix}_part{i}"
            tensors = [as_tensor_zero_copy(produce()) if tf.executing_eagerly() else produce()
                       for _, _, produce in group]
            tf.raw_ops.SaveV2(prefix=part, tensor_names=[k for k, _, _ in group],
                              shape_and_slices=[""] * len(group), tensors=tensors)
            del tensors
            prefixes.append(tf.convert_to_tensor(part))
    return prefixes


# ------------------------------------------------------------------------------------- restoring
class CheckpointRows:
    """Reads rows [first, stop) of one logical table from a checkpoint (a slice, one copy)."""

    def __init__(self, prefix, key, shape, table_name, kind):
        self.prefix, self.key, self.shape = prefix, key, tuple(shape)
        self.table_name, self.kind = table_name, kind

    def __call__(self, first, stop):
        height, width = self.shape
        spec = f"{height} {width} {first},{stop - first}:-"
        try:
            with tf.device("CPU:0"):
                tensor = tf.raw_ops.RestoreV2(prefix=self.prefix, tensor_names=[self.key],
                                              shape_and_slices=[spec], dtypes=[tf.float32])[0]
        except (tf.errors.OpError, IndexError, ValueError) as e:
            raise ValueError(f"table '{self.table_name}': cannot read its {self.kind} (rows "
                             f"{first}..{stop}) from checkpoint {self.prefix}, key '{self.key}': "
                             f"the files are truncated or corrupted ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
        return private_tf.numpy_view(tensor)

    def check_readable(self):
        """Reads the last row: fails now if the data file ends before this tensor does."""
        if self.shape[0]:
            self(self.shape[0] - 1, self.shape[0])


def _check_and_collect(trackables, prefix):
    """Validates every table first (no partial restore); returns per embedding readers."""
    try:
        shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except (tf.errors.OpError, IndexError, ValueError) as e:
        raise ValueError(f"checkpoint {prefix} cannot be read: {type(e).__name__}: {e}") from None
    allow_missing = getattr(_options, "allow_missing_slots", False)
    by_embedding = {}
    for object_name, node in sorted(trackables.items()):
        embedding = node.embedding
        if embedding is None:
            continue
        readers = {}
        for kind in node.kinds:
            key = _key(object_name, kind)
            if key not in shapes:
                if kind != PARAMETERS and _key(object_name, PARAMETERS) in shapes:
                    if not allow_missing:
                        raise ValueError(
                            f"table '{node.table_name}': checkpoint {prefix} has no '{kind}' slot, "
                            f"which the table's optimizer needs (it was saved with another "
                            "optimizer?). Nothing was restored. To change the optimizer on "
                            "purpose, restore inside tf_sc_embedding.checkpointing."
                            "allow_optimizer_change(): missing slots then keep their initial "
                            "values")
                    logging.warning("checkpoint %s has no slot '%s' for table '%s': the slot "
                                    "keeps its initial value", prefix, kind, node.table_name)
                continue
            if tuple(shapes[key]) != node.logical_shape:
                raise ValueError(
                    f"table '{node.table_name}': the checkpoint's {kind} has shape "
                    f"[vocabulary_size, dim] = {list(shapes[key])} but the TableConfig has "
                    f"{list(node.logical_shape)} (checkpoint {prefix}, key '{key}'); a table "
                    "with a different vocabulary or dimension cannot be restored")
            reader = CheckpointRows(prefix, key, shapes[key], node.table_name, kind)
            reader.check_readable()
            readers[kind] = reader
        by_embedding.setdefault(id(embedding), (embedding, {}))[1][node.table_name] = readers
    return by_embedding.values()


def _restore_fn(trackables, merged_prefix):
    """Registered restore function: validates everything, then restores chunk by chunk."""
    prefix = _as_str(merged_prefix)
    if prefix is None:
        raise NotImplementedError("restoring a TPUEmbeddingV2 checkpoint inside a tf.function is "
                                  "not supported: restore eagerly")
    for embedding, readers in _check_and_collect(trackables, prefix):
        embedding.restore_logical(readers)


def _is_logical_table(obj):
    return isinstance(obj, LogicalTable)


def _register():
    try:
        private_tf.register_checkpoint_saver(
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
