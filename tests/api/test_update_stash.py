"""The pipelining stash (pipelining.UpdateStash) on its own: keep a step's update inputs, apply
them exactly once, forget them on discard (docs/pipelining.md)."""
import numpy as np
import tensorflow as tf

import tf_sc_embedding as sce
from tf_sc_embedding import exchanges
from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.step import pipelining

E = tf.tpu.experimental.embedding
LR = 0.25


def _setup():
    table = E.TableConfig(vocabulary_size=16, dim=4, name="t", combiner="sum",
                          initializer=tf.constant_initializer(np.arange(64.0).reshape(16, 4)))
    # Two features on one table: the one-replica update reads each feature's gradient in place
    # (a list), which the stash must keep as one tensor.
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table),
                                    "g": E.FeatureConfig(table=table)}, E.SGD(LR))
    embedding.build(per_replica_batch_size=4)
    exchange, = exchanges.build(embedding.plan, embedding.exchange, embedding.replica_group,
                                None)
    return embedding, exchange


def _inputs(embedding, exchange, ids):
    view = collectives.ReplicaView(embedding.replica_group)
    preprocessed = exchange.preprocess(ids, {"f": None, "g": None})
    activations, kept = exchange.lookup(view, preprocessed, embedding.variables)
    gradients = exchange.stack_gradients({p: tf.ones_like(a) for p, a in activations.items()})
    return exchange.update_inputs(view, kept, gradients)[0]


def test_kept_update_runs_once_when_applied_and_never_again():
    embedding, exchange = _setup()
    ids = {"f": tf.constant([1, 2, 2, 5]), "g": tf.constant([5, 0, 1, 1])}
    targets = exchange.update_targets(0, embedding.variables)
    stash = pipelining.UpdateStash(list(targets), embedding.replica_group)
    before = embedding.logical_tables()["t"]

    stash.keep(0, _inputs(embedding, exchange, ids))
    np.testing.assert_array_equal(embedding.logical_tables()["t"], before)   # only kept

    stash.apply_pending(0, targets, "error")
    counts = np.bincount(np.concatenate([ids["f"].numpy(), ids["g"].numpy()]), minlength=16)
    expected = before - LR * counts[:, None]
    np.testing.assert_allclose(embedding.logical_tables()["t"], expected, rtol=1e-6)

    stash.apply_pending(0, targets, "error")                                 # nothing pending
    np.testing.assert_allclose(embedding.logical_tables()["t"], expected, rtol=1e-6)


def test_discard_forgets_the_kept_update():
    embedding, exchange = _setup()
    targets = exchange.update_targets(0, embedding.variables)
    stash = pipelining.UpdateStash(list(targets), embedding.replica_group)
    before = embedding.logical_tables()["t"]
    stash.keep(0, _inputs(embedding, exchange, {"f": tf.constant([0, 1, 2, 3]),
                                                 "g": tf.constant([3, 3, 3, 3])}))
    stash.discard()
    stash.apply_pending(0, targets, "error")
    np.testing.assert_array_equal(embedding.logical_tables()["t"], before)


def test_apply_pending_returns_a_zero_count_when_nothing_is_kept():
    embedding, exchange = _setup()
    targets = exchange.update_targets(0, embedding.variables)
    stash = pipelining.UpdateStash(list(targets), embedding.replica_group)
    assert int(stash.apply_pending(0, targets, "skip")) == 0
