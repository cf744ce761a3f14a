"""All-to-alls of counted entries, and how a receiver learns its counts.

The sharded exchange sends replica d, table after table, counts[d, t] entries of width widths[t]
(ids, then rows back, then gradient rows). What a replica receives depends on what every other
replica sends, and the transports learn it differently (docs/multi_worker.md#exchange):

- TensorFlow's all-to-all moves W equal chunks, so every replica sizes its buffers to the largest
  chunk any pair exchanges: one all-gather of every replica's counts before the first all-to-all
  tells every replica every pair, and each all-to-all of the step is sized from that. A sharded
  step launches 1 all-gather and 3 all-to-alls.
- oneCCL's ragged all-to-all (SceOnecclRaggedAllToAll) sends every rank only its own length, in
  the few bytes the ranks exchange before every collective anyway. The counts ride at the head of
  the ids' chunks, and every buffer is sized from this replica's own counts: 3 collectives, and no
  chunk is padded to another pair's size.

The choice is the transport's (`ReplicaView.counts_ride`); exchanges call the same methods either
way.
"""
import tensorflow as tf

from tf_sc_embedding.ops import replica_chunks


def _flat(buffer):
    return tf.reshape(buffer, [-1])


class CountedAllToAll:
    """The all-to-alls of one step whose chunks hold `send_counts` [W dest, T] entries per table
    (or entries sized from them, as rows and gradients are). Gathered (`pairs`: every pair's
    counts, [W source, W dest, T]) or riding (no pairs; ragged all-to-alls)."""

    def __init__(self, view, send_counts, pairs=None):
        self.view = view
        self.send_counts = send_counts
        self.pairs = pairs
        self.rides = pairs is None and view.counts_ride

    @classmethod
    def gathered(cls, view, send_counts):
        """One all-gather of every replica's counts, whatever the transport: every replica then
        knows every pair's counts, its receive counts (its column) and the chunk sizes all must
        agree on. One launch (W x W x T int32s) where an all-to-all of the counts and an all-max
        of the chunks would take two, at about 1 ms of wall time each on loopback."""
        W = view.num_replicas
        return cls(view, send_counts, tf.reshape(view.all_gather(send_counts[None]), [W, W, -1]))

    @classmethod
    def start(cls, view, send_counts):
        """Before the first all-to-all: gathers every replica's counts unless they ride."""
        return cls(view, send_counts) if view.counts_ride else cls.gathered(view, send_counts)

    @property
    def recv_counts(self):
        """[W source, T] what every replica sends here (gathered only; riding: from `first`)."""
        return self.pairs[:, self.view.replica_id, :]

    def chunk(self, counts, widths):
        """Elements per chunk of a buffer that holds counts [W, T] entries of widths [T]: the
        largest of this replica's chunks when counts ride, else the largest of every pair's."""
        if self.rides:
            return tf.reduce_max(tf.reduce_sum(counts * widths[None, :], axis=1))
        return tf.reduce_max(tf.reduce_sum(self.pairs * widths[None, None, :], axis=2))

    def first(self, values):
        """Sends per table the int32 entries values[t] (sorted by destination, send_counts[d, t]
        for replica d); returns (per table what every replica sent here, in replica order,
        recv_counts [W source, T])."""
        T = len(values)
        if not self.rides:
            ones = tf.ones([T], tf.int32)
            buffer = replica_chunks.pack_replica_chunks(values, self.send_counts,
                                                        self.chunk(self.send_counts, ones))
            received = self.all_to_all(buffer, self.send_counts, ones)
            return replica_chunks.unpack_replica_chunks(received, self.recv_counts,
                                                        [None] * T), self.recv_counts
        W = self.view.num_replicas
        header = tf.fill([W, 1], T)
        counts = tf.concat([header, self.send_counts], axis=1)   # the counts lead every chunk
        lengths = tf.reduce_sum(counts, axis=1)
        buffer = replica_chunks.pack_replica_chunks(
            [tf.reshape(self.send_counts, [-1])] + list(values), counts, tf.reduce_max(lengths))
        received = self.view.ragged_all_to_all(tf.reshape(buffer, [W, -1]), lengths)
        recv_counts = received[:, :T]
        unpacked = replica_chunks.unpack_replica_chunks(
            _flat(received), tf.concat([header, recv_counts], axis=1), [None] * (T + 1))
        return unpacked[1:], recv_counts

    def all_to_all(self, buffer, counts, widths, payload=None):
        """One all-to-all of a flat buffer of W chunks of self.chunk(counts, widths) elements
        (counts: what each chunk holds); returns the W received chunks, flat and equal.
        payload: what a float32 buffer carries (wire.py)."""
        W = self.view.num_replicas
        if not self.rides:
            return _flat(self.view.all_to_all(tf.reshape(buffer, [W, -1]), payload))
        lengths = tf.reduce_sum(counts * widths[None, :], axis=1)
        return _flat(self.view.ragged_all_to_all(tf.reshape(buffer, [W, -1]), lengths, payload))
