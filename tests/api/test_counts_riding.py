"""Counts riding with the ids (collectives/counted.py), in one process.

oneCCL's ragged all-to-all runs only between worker processes (tests/multiworker/test_oneccl.py
checks its bits there). Here a transport with a ragged all-to-all built from TensorFlow's own
collectives (an all-gather of the lengths, then an all-to-all of equal chunks: the semantics, not
the speed) runs the same exchange code under MirroredStrategy: it must give the bits of
TensorFlow's transport, whose counts travel in an all-gather of their own, with one collective
fewer per step and fewer bytes.
"""
import pytest
import tensorflow as tf

from tests.api.test_wire_precision import assert_same_bits, train
from tf_sc_embedding.collectives import transports

E = tf.tpu.experimental.embedding


class RaggedOverTensorFlow(transports.TensorFlowTransport):
    """A ragged all-to-all as the oneCCL op defines it (cc/ops/oneccl_ops.cc), out of two of
    TensorFlow's collectives."""

    ragged = True

    @staticmethod
    def ragged_sent(value, lengths):  # pylint: disable=unused-argument
        return lengths

    def launch_ragged(self, value, lengths, replica_id):
        W = self.group.num_replicas
        every = tf.reshape(self.launch("all_gather", lengths, replica_id), [W, W])
        longest = tf.cast(tf.reduce_max(every), tf.int32)
        width = tf.shape(value)[1]
        equal = tf.pad(value[:, :longest], [[0, 0], [0, longest - tf.minimum(longest, width)]])
        received = self.launch("all_to_all", equal, replica_id)
        lengths_here = tf.cast(every[:, replica_id], tf.int32)
        kept = received[:, :tf.reduce_max(lengths_here)]
        inside = tf.range(tf.shape(kept)[1])[None, :] < lengths_here[:, None]
        return tf.where(inside, kept, tf.zeros_like(kept))


@pytest.mark.parametrize("replicas,precision,exact", [
    (2, "float32", False), (2, "16bit", True),
    pytest.param(4, "float32", False, marks=pytest.mark.slow)])
def test_riding_counts_give_the_bits_of_gathered_counts(replicas, precision, exact, monkeypatch):
    optimizer = E.SGD(learning_rate=0.5) if exact else E.Adagrad(learning_rate=0.3)
    gathered = train(replicas, precision, exact, optimizer)
    monkeypatch.setattr(transports, "TensorFlowTransport", RaggedOverTensorFlow)
    ridden = train(replicas, precision, exact, optimizer)
    assert_same_bits(ridden[:2], gathered[:2])
    # No all-gather of the counts, and no chunk padded to another pair's size.
    assert (gathered[3], ridden[3]) == (4, 3)
    assert 0 < ridden[2] < gathered[2], (ridden[2], gathered[2])
