"""Prefetching the next batch's lookup: with pipelining, step N exchanges the ids and rows of batch
N+1 while its own dense forward and backward run (docs/pipelining.md#prefetching-the-next-lookup).

A pipelined step that is given the next batch (`TPUEmbeddingV2.embedding_lookup(features,
next_features=...)`) returns batch N's activations from what step N-1 prefetched, then, once the
kept update of step N-1 has been applied, runs what it can of batch N+1's lookup and keeps it here
for step N+1. For fixed tables that is the whole lookup (routing, the collectives, the rows and
the combiners); for open vocabularies only the key exchange, since mapping keys changes the maps
(exchanges/base.py `look_ahead`, `lookup_after`). Nothing of that depends on batch N's
gradients, so TensorFlow may run it beside the dense model (which pays where the collectives'
transport has cores of its own; BENCHMARKS.md#pipelining-over-two-workers). The tables read by
the prefetch hold the updates of steps 0..N-1, exactly what step N+1's lookup would read under
pipelining, so the numbers are those of the pipelined step without prefetching, bit for bit.

`PrefetchStash` holds, per local replica, one prefetched lookup: what each exchange looked ahead
(`base.Ahead`) as flat tensors (in variables whose shape may change), a fingerprint of the batch
they belong to, and a pending flag. A prefetch is used by the next lookup only, and only if that
lookup's batch has the same fingerprint; any other lookup forgets it.
"""
import threading

import tensorflow as tf

from tf_sc_embedding import private_tf
from tf_sc_embedding.ops.require import require
from tf_sc_embedding.tables import feature_shapes


def check_prefetch_call(what, pipelining, *structures):
    """Raises ValueError unless a lookup may be prefetched: with pipelining, and with one
    replica's own tensors (inside strategy.run)."""
    if not pipelining:
        raise ValueError(f"{what} (prefetching a lookup) needs "
                         "pipeline_execution_with_tensor_core=True")
    if feature_shapes.has_distributed_values(*structures):
        raise ValueError(f"{what}: call the embedding inside strategy.run with each "
                         "replica's own tensors")


def check_next_batch(paths, flat_ids, next_flat_ids):
    """Raises ValueError naming the feature unless the next batch is a batch like this one: the
    next step reads this step's prefetch for its own batch."""
    for path, ids, next_ids in zip(paths, flat_ids, next_flat_ids):
        feature_shapes.check_same_kind(path, ids, next_ids, "next_features")


def batch_fingerprint(flat_ids, flat_weights):
    """An int64 scalar that identifies one replica's batch: a 64-bit fingerprint (tf.fingerprint,
    FarmHash) of every feature's ids, row partition and weights, so that a step given another
    batch than the one prefetched for it fails instead of training on the wrong rows.

    One fingerprint per tensor, read in place: casting and concatenating the tensors into one
    buffer first costs more than the ops it saves (BENCHMARKS.md#pipelining-over-two-workers).
    """
    parts = []
    for ids, weights in zip(flat_ids, flat_weights):
        for value in (ids, weights):
            if value is None:
                continue
            if isinstance(value, tf.RaggedTensor):
                pieces = [value.flat_values] + list(value.nested_row_splits)
            elif isinstance(value, tf.SparseTensor):
                pieces = [value.values, value.indices, value.dense_shape]
            else:
                pieces = [tf.convert_to_tensor(value)]
            parts.extend(tf.fingerprint(tf.reshape(piece, [1, -1])) for piece in pieces)
    combined = tf.fingerprint(tf.concat(parts, axis=1))
    return tf.reshape(tf.bitcast(combined, tf.int64), [])


class PrefetchStash:
    """Per local replica: one prefetched lookup (its flat tensors), its batch fingerprint and a
    pending flag. The flag and fingerprint exist from build(); the variables of the tensors are
    created when the first prefetch is traced (their number, dtypes and nesting are those of the
    lookup's outputs, which depend on the exchanges), so a step that reads a prefetch must be
    traced after one (`TPUEmbeddingV2.prefetch` before the first step)."""

    def __init__(self, group):
        self._devices = dict(zip(group.local_replica_ids, group.local_devices))
        self._pending, self._fingerprints, self._values = {}, {}, {}
        self._structure = None    # (nested lookup outputs with None leaves, static shapes)
        self._lock = threading.Lock()
        with tf.init_scope():
            for replica_id, device in self._devices.items():
                with tf.device(device):
                    self._pending[replica_id] = private_tf.plain_variable(
                        tf.constant(False), f"prefetched_lookup_pending_replica_{replica_id}")
                    self._fingerprints[replica_id] = private_tf.plain_variable(
                        tf.constant(0, tf.int64),
                        f"prefetched_lookup_fingerprint_replica_{replica_id}")

    def _variables(self, replica_id):
        """The variables of a replica's kept tensors (created on first use, in init_scope)."""
        with self._lock:
            existing = self._values.get(replica_id)
            if existing is None:
                _, shapes = self._structure
                with tf.init_scope(), tf.device(self._devices[replica_id]):
                    existing = [private_tf.shapeless_variable(
                        tf.zeros([0], dtype), f"prefetched_lookup_{i}_replica_{replica_id}")
                        for i, (dtype, _) in enumerate(shapes)]
                self._values[replica_id] = existing
            return existing

    def keep(self, replica_id, aheads, fingerprint):
        """Keeps what the exchanges looked ahead (a list of `base.Ahead`, nests of tensors and
        None) for the next step; returns the op that marks them pending.

        The flag is cleared before any write and set after the last, so a step stopped half-way
        leaves no prefetch rather than a mixed one. Static shapes are kept for the activations
        only (fixed by the layout); the other tensors' sizes change with every batch.
        """
        tensors, shapes = [], []
        for ahead in aheads:
            for t in tf.nest.flatten(ahead.activations):
                tensors.append(t)
                shapes.append((t.dtype, t.shape))
            for t in tf.nest.flatten(ahead.kept):
                if t is not None:
                    tensors.append(t)
                    shapes.append((t.dtype, tf.TensorShape([None] * t.shape.rank)))
        present = tf.nest.map_structure(lambda t: t is not None, list(aheads))
        with self._lock:
            if self._structure is None:
                self._structure = (present, shapes)
            elif (self._structure[0] != present or
                  [d for d, _ in self._structure[1]] != [d for d, _ in shapes]):
                raise RuntimeError("the prefetched lookup changed its outputs between traces")
        with tf.control_dependencies([self.forget(replica_id)]):
            writes = [v.assign(t) for v, t in zip(self._variables(replica_id), tensors)]
        with tf.control_dependencies(writes):
            written = self._fingerprints[replica_id].assign(fingerprint)
        with tf.control_dependencies([written]):
            return self._pending[replica_id].assign(True)

    def read(self, replica_id, fingerprint, batch):
        """(the kept list of `base.Ahead`, `batch`), both coming out of the checks that there
        is a prefetch and that `fingerprint` is its batch's: fails with InvalidArgument
        otherwise, before anything reads them. batch: a nest of tensors (composites and None
        allowed), this step's own features, for the exchanges that complete their lookup from
        them: a data dependency on the checks, which a stateless op needs (a check whose
        outputs only fed control edges would be pruned by Grappler)."""
        if self._structure is None:
            raise RuntimeError("a step that uses next_features reads the lookup the previous "
                               "step prefetched: call prefetch(first batch) (inside "
                               "strategy.run) before the first such step")
        present, shapes = self._structure
        # require, not tf.debugging: see ops/require.py.
        [fingerprint_kept] = require(
            self._pending[replica_id].read_value(),
            [self._fingerprints[replica_id].read_value()],
            "TPUEmbeddingV2: no prefetched lookup for this step: call prefetch(features) "
            "before the first step that passes next_features (and again after a restore or a "
            "lookup without next_features)")
        leaves = tf.nest.flatten(batch, expand_composites=True)
        given = [t for t in leaves if t is not None]
        kept = [v.read_value() for v in self._variables(replica_id)]
        checked = require(
            tf.equal(fingerprint_kept, fingerprint), kept + given,
            "TPUEmbeddingV2: the features of this step are not the batch prefetched for it "
            "(every step's features must be the previous step's next_features, or the batch "
            "given to prefetch)")
        values = iter([tf.ensure_shape(v, shape)
                       for v, (_, shape) in zip(checked[:len(kept)], shapes)])
        passed = iter(checked[len(kept):])
        batch = tf.nest.pack_sequence_as(
            batch, [None if t is None else next(passed) for t in leaves], expand_composites=True)
        return tf.nest.map_structure(lambda kept: next(values) if kept else None, present), batch

    def forget(self, replica_id):
        """Drops a replica's prefetched lookup (a lookup that does not use it came first)."""
        return self._pending[replica_id].assign(False)

    def discard(self):
        """Drops every prefetched lookup (after a restore: they were read from the old tables)."""
        with tf.init_scope():
            for pending in self._pending.values():
                pending.assign(False)
