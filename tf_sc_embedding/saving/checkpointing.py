"""Topology-independent checkpoints of `TPUEmbeddingV2` through plain `tf.train.Checkpoint`.

Key layout: the one of TensorFlow's CPU class `tf.tpu.experimental.embedding.TPUEmbeddingForServing`
(and of TensorFlow's own embedding checkpoints), per user table, under the object path of the
embedding (e.g. ``embedding`` for ``tf.train.Checkpoint(embedding=...)``):

* ``<path>/<table>/.ATTRIBUTES/VARIABLE_VALUE``: the logical ``[vocabulary_size, dim]`` table
  (unstacked, unpadded, unrotated); the object graph has a child ``<table>`` of the embedding;
* ``<path>/<table>.S<slot>/.ATTRIBUTES/VARIABLE_VALUE``: each optimizer slot (child
  ``<table>/<slot>``, ``/`` being escaped as ``.S`` in keys), same shape ([vocabulary_size, 1]
  for a row-wise slot);
* ``<path>/<table>/.ATTRIBUTES/layout``: a JSON string with the layout that was in use, for
  inspection only (TensorFlow ignores it).

So a checkpoint of a `TPUEmbeddingV2` restores into `TPUEmbeddingForServing` built from the same
feature config, and a checkpoint of `TPUEmbeddingForServing` restores here. Nothing depends on the
replica count or on stacking, so a checkpoint restores into any topology.

Mechanism. TensorFlow's default saver materializes every serialized tensor of a checkpoint before
writing any (a second copy of *all* tables and slots), and its default restore reads them all at
once. Instead:

* Saving: the table and slot nodes (`LogicalTable`, one per table and kind) serialize to ``None``,
  which records their ``VARIABLE_VALUE`` attribute in the object graph without writing a value.
  The embedding itself is saved by a registered checkpoint saver (package `tf_sc_embedding`, name
  `LogicalEmbeddingTable`) whose save function writes exactly those keys: it gathers one logical
  table at a time (strided copies from zero-copy views of the shards), writes it with `SaveV2` to
  its own part file and drops it; TensorFlow merges the part files with the rest of the checkpoint
  (`MergeV2Checkpoints`), so it is still one atomic V2 checkpoint. A table taller than
  `table_storage.LOGICAL_CHUNK_ROWS` is written as row slices of that many rows (TensorFlow's
  format for partitioned variables, under the same key and full shape): TensorFlow's bundle reader
  loads a whole stored slice for any read that touches it, so a table stored in one piece would be
  loaded whole once per chunk that a restore reads. Reading the whole tensor (TensorFlow's own
  restore, `tf.train.load_variable`) joins the slices.
* Restoring: the embedding hands out its nodes through `_lookup_dependency` only while a restore
  looks them up; the nodes then match the registered saver, and TensorFlow passes the checkpoint
  key of each node to the registered restore function (its path for checkpoints with a recorded
  attribute but no registered saver). It validates everything first, then reads chunks of rows
  with `RestoreV2` slices and writes into the shards in place the rows this process holds (under
  MultiWorkerMirroredStrategy every worker reads every chunk, one at a time, and keeps its own
  rows: with the mod-sharded layout a worker's rows are interleaved through the whole table). The
  registered saver is not strict, so TensorFlow's own classes skip the embedding node and restore
  the table variables.
* Checkpoints of earlier versions (keys ``<path>/<table>/.ATTRIBUTES/parameters`` and
  ``.../<slot>``, written by the registered saver on each table node) still restore.

Saving under MultiWorkerMirroredStrategy follows TensorFlow's convention (every worker calls
`save`, the chief with the real path): each table is gathered from all workers during the save,
one table at a time, so the chief's checkpoint is complete.

Deferred restoration: restoring into an embedding that is not built yet validates the checkpoint
(shapes, per table) and remembers where its tables are; `build()` then creates the variables from
the checkpointed values instead of running the initializers, reading one chunk at a time. The
checkpoint files must still exist when the embedding is built.

Before anything is written, every table's shapes are checked, every slot the configured
optimizer needs must be present (unless `allow_optimizer_change()` is active, in which case
missing slots keep their initial values), and the last row of every tensor is read (a truncated
data file fails here, naming the table, not half-way through a restore).
"""
import json
import weakref

import tensorflow as tf

from tf_sc_embedding.tables import logical_tables
from tf_sc_embedding import private_tf
from tf_sc_embedding.tables import table_storage
from tf_sc_embedding.tables.table_storage import PARAMETERS, as_tensor_zero_copy

SAVER_PACKAGE = "tf_sc_embedding"
SAVER_NAME = "LogicalEmbeddingTable"
LAYOUT_KEY = "layout"
VALUE_KEY = "VARIABLE_VALUE"     # the attribute name of a tf.Variable in checkpoints

# Restores inside this block accept a checkpoint without some optimizer slots (the one
# validation rule lives in logical_tables.check_restorable).
allow_optimizer_change = logical_tables.allow_optimizer_change


def child_name(table_name, kind):
    """The embedding's checkpoint child of a table's parameters or slot (TensorFlow's names)."""
    return table_name if kind == PARAMETERS else f"{table_name}/{kind}"


class KindNode(private_tf.Trackable):
    """Checkpoint node of one table's parameters or one slot: a `tf.Variable` to TensorFlow."""

    def __init__(self, table, kind):
        self.table = table
        self.kind = kind
        self.restoring = False   # True only while a restore looks this node up

    def _serialize_to_tensors(self):
        # Recorded in the object graph as a variable, written by the embedding's registered saver:
        # a save spec whose value is None is recorded but not written by TensorFlow's saver. The
        # parameters node also saves the (small) layout record the ordinary way, so TensorFlow's
        # saver always has a real tensor on this process's CPU (it cannot write zero tensors).
        with tf.init_scope(), tf.device("CPU:0"):
            layout = tf.constant(_layout_record(self.table)) if self.kind == PARAMETERS else None
        tensors = {VALUE_KEY: private_tf.SaveSpec(
            lambda: None, "", None, dtype=tf.float32,
            device=layout.device if layout is not None else _cpu_device())}
        if layout is not None:
            tensors[LAYOUT_KEY] = layout
        return tensors

    def _restore_from_tensors(self, restored_tensors):   # only reached without the registered saver
        raise NotImplementedError("restore tf_sc_embedding tables through tf.train.Checkpoint of "
                                  "the embedding (or of an object tracking it)")


def _cpu_device():
    with tf.init_scope(), tf.device("CPU:0"):
        return tf.zeros([]).device


class LogicalTable:
    """One user table of a `TPUEmbeddingV2`: its checkpoint nodes (values and slots, logical)."""

    def __init__(self, embedding, table_name):
        self._embedding_ref = weakref.ref(embedding)
        self.table_name = table_name
        self.kinds = embedding.tables.kinds(table_name)
        self.logical_shape = embedding.tables.shape(table_name)
        self.shapes = {kind: embedding.tables.shape(table_name, kind) for kind in self.kinds}
        self.nodes = {kind: KindNode(self, kind) for kind in self.kinds}

    @property
    def embedding(self):
        return self._embedding_ref()


UPDATE_STEP = "update_step"


class UpdateStepNode(private_tf.Trackable):
    """Checkpoint node of the embedding's update step (the step that stochastically rounds
    16-bit rows), so that training resumed from a checkpoint rounds as an uninterrupted run
    would. Only embeddings with a 16-bit table have it (older checkpoints need not)."""

    def __init__(self, embedding):
        self._embedding_ref = weakref.ref(embedding)

    def _serialize_to_tensors(self):
        with tf.init_scope(), tf.device("CPU:0"):
            return {VALUE_KEY: tf.constant(self._embedding_ref().update_step(), tf.int64)}

    def _restore_from_tensors(self, restored_tensors):
        self._embedding_ref().restore_update_step(int(restored_tensors[VALUE_KEY].numpy()))
        return tf.no_op()


DELTA_POSITION = "delta_position"


class DeltaPositionNode(private_tf.Trackable):
    """Checkpoint node of the tables' position in their chain of deltas (deltas/stream.py): a
    restore returns the stream to it, so the deltas written after this checkpoint apply to it.
    Only embeddings that track deltas have it."""

    def __init__(self, stream):
        self._stream = stream

    def _serialize_to_tensors(self):
        self._stream.note_base()
        with tf.init_scope(), tf.device("CPU:0"):
            return {VALUE_KEY: tf.constant(self._stream.position)}

    def _restore_from_tensors(self, restored_tensors):
        self._stream.restored(restored_tensors[VALUE_KEY].numpy().decode())
        return tf.no_op()


class CheckpointChildren:
    """An embedding's checkpoint children: one `LogicalTable` per fixed user table, the nodes of
    its open-vocabulary tables, and the update step when a table has 16-bit rows. They exist before
    build() so that a checkpoint restored early is consumed by build(); none depends on the
    topology (the per-replica variables are never checkpointed directly)."""

    def __init__(self, embedding, fixed_tables, dynamic_nodes, with_update_step,
                 delta_stream=None):
        self.tables = {name: LogicalTable(embedding, name) for name in fixed_tables}
        self.dynamic = dict(dynamic_nodes)
        self.update_step = UpdateStepNode(embedding) if with_update_step else None
        self.delta_position = DeltaPositionNode(delta_stream) if delta_stream else None

    def children(self):
        """Every child by name; also ends any restore look-up of them."""
        children = {} if self.update_step is None else {UPDATE_STEP: self.update_step}
        if self.delta_position is not None:
            children[DELTA_POSITION] = self.delta_position
        for table in self.tables.values():
            for kind, node in table.nodes.items():
                node.restoring = False
                children[child_name(table.table_name, kind)] = node
        children.update(self.dynamic)
        return children

    def lookup(self, name):
        """A child looked up by a restore (a table's node then restores through the registered
        saver), or None."""
        if name == UPDATE_STEP:
            return self.update_step
        if name == DELTA_POSITION:
            return self.delta_position
        if name in self.dynamic:
            return self.dynamic[name]
        for table in self.tables.values():
            for kind, node in table.nodes.items():
                if child_name(table.table_name, kind) == name:
                    node.restoring = True
                    return node
        return None


def _key(object_name, local_name):
    return private_tf.checkpoint_key(object_name, local_name)


def _child_path(object_name, name):
    """A child's object path; the root object's path is "" (tf.train.Checkpoint(embedding)), and
    its children's keys then start with the child's name, as TensorFlow writes them."""
    escaped = private_tf.escape_local_name(name)
    return f"{object_name}/{escaped}" if object_name else escaped


def value_key(embedding_path, table_name, kind):
    """The checkpoint key of a table's parameters or slot under the embedding's object path."""
    return _key(_child_path(embedding_path, child_name(table_name, kind)), VALUE_KEY)


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
        replicated = storage.is_replicated(node.table_name)
        record.update(
            placement="replicated" if replicated else "sharded", job_replicas=storage.num_replicas,
            stacked_table=layout.stacked_table_name, row_offset=layout.sparse_core_shard_row_offset,
            rotation=layout.sparse_core_shard_rotation, padded_height=layout.padded_height,
            padded_width=layout.padded_width,
            rows_per_sparse_core_shard=layout.total_rows_per_sparse_core_shard,
            # A replicated table is laid out for one replica and held whole by every replica.
            num_replicas=1 if replicated else storage.num_replicas,
            sparse_cores_per_replica=storage.sparse_cores,
            num_sparse_cores=layout.num_sparse_cores, optimizer=placement.optimizer.definition_name,
            combiner=placement.combiner)
    return json.dumps(record, sort_keys=True)


def _saved_items(node):
    """(kind, producer) of the values one table saves now; producer() -> array or tensor. Before
    build() that is what a restore keeps for the table, if anything."""
    tables = node.embedding.tables
    return [(kind, lambda k=kind: tables.saved_value(node.table_name, k))
            for kind in node.kinds if tables.has_value(node.table_name, kind)]


def _row_slices(shape):
    """(first row, rows, SaveV2 slice spec) of the pieces one logical table is written in.

    One piece ("", TensorFlow's whole-tensor spec) up to LOGICAL_CHUNK_ROWS rows; taller tables in
    row slices of exactly the chunks that restoring reads (TableStorage.write_logical).
    """
    chunks = table_storage.logical_chunks(shape[0])
    if len(chunks) <= 1:
        return [(0, shape[0], "")]
    return [(first, stop - first, row_slice_spec(shape, first, stop)) for first, stop in chunks]


def row_slice_spec(shape, first, stop):
    """The SaveV2 / RestoreV2 slice spec of rows [first, stop) of a [height, width] tensor."""
    return f"{shape[0]} {shape[1]} {first},{stop - first}:-"


def _save_arguments(group):
    """SaveV2's (tensor names, slice specs, tensors) for a group of (key, nbytes, producer, shape).

    A function of its own so that no local name outlives it: a row slice is a view that keeps
    its whole table alive, and a lingering one would hold that table through the next group.
    """
    names, specs, tensors = [], [], []
    for key, _, produce, shape in group:
        value = produce()
        for first, rows, spec in _row_slices(shape):
            piece = value if not spec else value[first:first + rows]
            names.append(key)
            specs.append(spec)
            tensors.append(as_tensor_zero_copy(piece) if tf.executing_eagerly() else piece)
    return names, specs, tensors


def _save_fn(trackables, file_prefix):
    """Registered save function of embeddings: one logical table in memory at a time."""
    prefix = _as_str(file_prefix)
    items = []
    for object_name, embedding in sorted(trackables.items(), key=lambda kv: kv[0]):
        if not _is_embedding(embedding):
            continue
        for table in embedding.checkpoint_nodes().values():
            for kind, produce in _saved_items(table):
                height, width = table.shapes[kind]
                items.append((value_key(object_name, table.table_name, kind), 4 * height * width,
                              produce, (height, width)))
    # Group small tables into one SaveV2 call while a group stays within the largest single item,
    # so at most one extra copy of the largest table is ever held.
    budget = max([item[1] for item in items] + [1])
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
        for i, group in enumerate(groups):
            part = (file_prefix + f"_part{i}") if prefix is None else f"{prefix}_part{i}"
            names, specs, tensors = _save_arguments(group)
            save = tf.raw_ops.SaveV2(prefix=part, tensor_names=names, shape_and_slices=specs,
                                     tensors=tensors)
            del tensors   # the group's tables: the only references left
            # In a graph, TensorFlow merges the part files after the returned prefixes, so they
            # must depend on the writes.
            with tf.control_dependencies([save] if save is not None else []):
                prefixes.append(tf.identity(part))
    return prefixes


# ------------------------------------------------------------------------------------- restoring
class CheckpointRows:
    """Reads rows [first, stop) of one logical table from a checkpoint (a slice, one copy)."""

    def __init__(self, prefix, key, shape, table_name, kind):
        self.prefix, self.key, self.shape = prefix, key, tuple(shape)
        self.table_name, self.kind = table_name, kind

    def __call__(self, first, stop):
        spec = row_slice_spec(self.shape, first, stop)
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
        """Reads one row of every stored piece, so that a truncated or corrupted file fails now,
        before anything is written: TensorFlow checks a piece's checksum whenever it loads it,
        and a tall table is stored in row slices (`_row_slices`), one piece at a time here."""
        for first, _, _ in _row_slices(self.shape):
            self(first, first + 1)


_VALUE_SUFFIX = "/.ATTRIBUTES/" + VALUE_KEY


def _candidate_keys(name, node):
    """{kind: checkpoint key} a restored node may read.

    `name` is a checkpoint key (the node was saved as a variable: this layout, or TensorFlow's)
    or an object path (the node was saved by the registered saver of earlier versions, which
    wrote every kind of the table under ``<path>/.ATTRIBUTES/<kind>``).
    """
    if "/.ATTRIBUTES/" in name:
        return {node.kind: name[:name.rindex("/.ATTRIBUTES/")] + _VALUE_SUFFIX}
    if node.kind != PARAMETERS:
        return {}
    return {kind: _key(name, kind) for kind in node.table.kinds}


def _check_and_collect(found, prefix, shapes):
    """Validates every table first (no partial restore); returns per embedding readers.

    found: {LogicalTable: {kind: checkpoint key}} of the nodes this restore matched.
    """
    by_embedding = {}
    for table, keys in found.items():
        embedding = table.embedding
        if embedding is None:
            continue
        present = {kind: key for kind, key in keys.items() if key in shapes}
        if not present:
            continue
        restorable = logical_tables.check_restorable(
            embedding.tables, {table.table_name: {k: shapes[key] for k, key in present.items()}},
            "the checkpoint", location=f" {prefix}")[table.table_name]
        readers = {}
        for kind, key in present.items():
            if kind not in restorable:
                continue
            reader = CheckpointRows(prefix, key, shapes[key], table.table_name, kind)
            reader.check_readable()
            readers[kind] = reader
        by_embedding.setdefault(id(embedding), (embedding, {}))[1][table.table_name] = readers
    return by_embedding.values()


def _restore_fn(trackables, merged_prefix):
    """Registered restore function: validates everything, then restores chunk by chunk.

    TensorFlow runs it after every other node's restore, so the open-vocabulary tables of the
    checkpoint have been checked and staged by then (dynamic_tables.DynamicTableNode): they are
    imported here, once the fixed tables passed their checks too, so a table that fails leaves
    every table of the embedding as it was."""
    embeddings = [node for node in trackables.values() if _is_embedding(node)]
    try:
        _restore_checked(trackables, merged_prefix, embeddings)
    finally:
        for embedding in embeddings:
            embedding.dynamic_tables.discard_staged()


def _restore_checked(trackables, merged_prefix, embeddings):
    found = {}
    for name, node in trackables.items():
        if isinstance(node, KindNode):
            node.restoring = False
            found.setdefault(node.table, {}).update(_candidate_keys(name, node))
    checked = []
    if found:           # else only embedding nodes: their fixed tables come as their own nodes
        prefix = _as_str(merged_prefix)
        if prefix is None:
            raise NotImplementedError("restoring a TPUEmbeddingV2 checkpoint inside a "
                                      "tf.function is not supported: restore eagerly")
        try:
            shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
        except (tf.errors.OpError, IndexError, ValueError) as e:
            raise ValueError(f"checkpoint {prefix} cannot be read: {type(e).__name__}: "
                             f"{e}") from None
        checked = list(_check_and_collect(found, prefix, shapes))
    for embedding in embeddings:   # the embedding is a node of the same restore as its tables
        embedding.dynamic_tables.commit_staged(private_tf.restore_uid(embedding))
    for embedding, readers in checked:
        embedding.tables.restore(readers)


def _is_embedding(obj):
    return getattr(obj, "_sce_checkpoint_writer", False)


def _is_saved_by_us(obj):
    return _is_embedding(obj) or (isinstance(obj, KindNode) and obj.restoring)


def _register():
    try:
        private_tf.register_checkpoint_saver(
            package=SAVER_PACKAGE, name=SAVER_NAME, predicate=_is_saved_by_us,
            save_fn=_save_fn, restore_fn=_restore_fn, strict_predicate_restore=False)
    except ValueError:  # already registered (module reloaded)
        pass


_register()


# ------------------------------------------------------------------------------------- helpers
def read_saved_layouts(checkpoint_path):
    """The layouts recorded in a checkpoint: {checkpoint path of the table: dict}."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    suffix = "/.ATTRIBUTES/" + LAYOUT_KEY
    return {key[:-len(suffix)]: json.loads(reader.get_tensor(key))
            for key in reader.get_variable_to_shape_map() if key.endswith(suffix)}
