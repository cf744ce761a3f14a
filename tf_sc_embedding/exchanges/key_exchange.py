"""Open-vocabulary keys to the replicas that own them, and their rows back
(docs/dynamic_vocabulary.md#several-replicas).

A dynamic table over W replicas keeps each key in the map of its owner shard
(ops.key_row_map.key_owner_shards). In a step every replica sends, per dynamic table, each
distinct key of its batch once, with the number of its occurrences, to the key's owner; the owner
maps what it receives (its map sees every occurrence over all replicas, so admission counts do
not depend on how the batch was split) and answers each key with its table row. For all tables
at once this costs one all-gather of the counts (and of the maps' last steps, so that every map
of a table maps the same step) and two all-to-alls:

1. `send_keys`: per table, the batch's distinct keys (`tf.unique`, first-appearance order) are
   grouped by owner (stable) and sent as int32 triples (hash low word, high word, occurrences);
   string keys add their length, and their bytes go in the same all-to-all, one int32 each;
2. the owner receives, per table, the keys of every replica in replica order (`KeysAtOwner`);
3. `return_rows`: the owner's rows go back in the same chunks, and each replica spreads them
   over its occurrences.
"""
import collections

import tensorflow as tf

from tf_sc_embedding.exchanges import all_to_all
from tf_sc_embedding.ops.key_row_map import key_hashes, key_owner_shards

# One table's keys as its owner receives them: keys [m] (int64, or strings), their occurrences in
# the senders' batches [m] int32, from replica 0's first to the last replica's last.
KeysAtOwner = collections.namedtuple("KeysAtOwner", ["keys", "counts"])
# What return_rows needs of send_keys: per table, each occurrence's distinct key and the owner
# order of the distinct keys; the entries per (replica, table) sent and received, and the chunk
# of the answer (the largest number of keys one replica sends another).
KeyRoute = collections.namedtuple("KeyRoute", ["positions", "orders", "send_counts",
                                               "recv_counts", "answer_chunk"])

_KEY_WORDS = 3      # hash low word, hash high word, occurrences
_STRING_WORDS = 4   # ... and the string's length in bytes
# Every byte value as a one-byte string: received bytes are joined back into strings with them.
_BYTE_STRINGS = [bytes([b]) for b in range(256)]


def send_keys(view, keys_by_table, last_steps):
    """(per table KeysAtOwner of the keys this replica owns, KeyRoute, per table the step every
    replica's map maps: one past the largest last step of all of them, int64).

    keys_by_table: per dynamic table, every occurrence of its keys in this replica's batch ([n],
    int64 or string); last_steps: per table, this replica's map's last step (ride in the
    all-gather of the counts)."""
    W = view.num_replicas
    positions, orders, payloads, counts = [], [], [], []
    byte_payloads, byte_counts = [], []
    for keys in keys_by_table:
        unique, position = tf.unique(keys, out_idx=tf.int32)
        occurrences = tf.math.unsorted_segment_sum(tf.ones_like(position), position,
                                                   tf.size(unique))
        hashes = key_hashes(unique)
        owners = key_owner_shards(hashes, W)
        order = tf.argsort(owners, stable=True)
        words = [_hash_words(unique), occurrences[:, None]]
        if keys.dtype == tf.string:
            lengths = tf.strings.length(unique, unit="BYTE")
            words.append(lengths[:, None])
            ordered = tf.gather(unique, order)
            byte_payloads.append(_string_bytes(ordered))
            byte_counts.append(tf.math.unsorted_segment_sum(lengths, owners, W))
        positions.append(position)
        orders.append(order)
        payloads.append(tf.gather(tf.concat(words, axis=1), order))
        counts.append(tf.math.bincount(owners, minlength=W, maxlength=W, dtype=tf.int32))
    T = len(keys_by_table)
    send_counts = tf.stack(counts + byte_counts, axis=1)                 # [W dest, entries]
    widths = [int(p.shape[1]) for p in payloads] + [1] * len(byte_payloads)
    # One more row, the maps' last steps (steps fit in int32: cc/core/key_row_map.h).
    steps_row = tf.pad(tf.cast(tf.stack(last_steps), tf.int32)[None, :],
                       [[0, 0], [0, len(byte_payloads)]])
    gathered = tf.reshape(view.all_gather(tf.concat([send_counts, steps_row], axis=0)[None]),
                          [W, W + 1, -1])                                # [source, dest, entries]
    steps = tf.cast(tf.reduce_max(gathered[:, W, :T], axis=0), tf.int64) + 1
    every = gathered[:, :W, :]
    recv_counts = every[:, view.replica_id, :]
    chunk = tf.reduce_max(tf.reduce_sum(every * tf.constant(widths)[None, None, :], axis=2))
    answer_chunk = tf.reduce_max(tf.reduce_sum(every[:, :, :T], axis=2))
    received = all_to_all.unpack_by_replica(
        all_to_all.all_to_all_flat(view, all_to_all.pack_by_replica(
            payloads + byte_payloads, send_counts, chunk)),
        recv_counts, widths)
    at_owner, strings = [], iter(received[T:])
    for keys, words in zip(keys_by_table, received[:T]):
        if keys.dtype == tf.string:
            owned = _strings_of(tf.reshape(next(strings), [-1]), words[:, 3])
        else:
            owned = tf.reshape(tf.bitcast(words[:, :2], tf.int64), [-1])
        at_owner.append(KeysAtOwner(owned, words[:, 2]))
    return at_owner, KeyRoute(positions, orders, send_counts[:, :T], recv_counts[:, :T],
                              answer_chunk), tf.unstack(steps, num=T)


def every_occurrence(keys, counts):
    """Each of `keys` repeated `counts` times, in order (what the owner's map steps through).

    `tf.repeat` builds a [len(keys), max(counts)] mask: a hot key seen thousands of times in a
    batch made it cost up to 20 ms per table. Here each key's first position is marked and a
    running sum numbers the positions: O(sum(counts)). A key with count 0 marks the same position
    as the next key (bincount adds the marks), so it is skipped."""
    starts = tf.cumsum(counts, exclusive=True)
    total = tf.reduce_sum(counts)
    marks = tf.math.bincount(starts, minlength=total, maxlength=total, dtype=counts.dtype)
    return tf.gather(keys, tf.cumsum(marks) - 1)


def return_rows(view, route, rows_at_owner):
    """Per table, the row of every occurrence of this replica's keys (int32 [n]).

    rows_at_owner: per table, the owner's row for each key of send_keys' KeysAtOwner (int32
    [m])."""
    answers = all_to_all.unpack_by_replica(
        all_to_all.all_to_all_flat(view, all_to_all.pack_by_replica(
            list(rows_at_owner), route.recv_counts, route.answer_chunk)),
        route.send_counts, [None] * len(rows_at_owner))
    rows = []
    for answer, order, position in zip(answers, route.orders, route.positions):
        by_key = tf.gather(answer, tf.math.invert_permutation(order))   # first-appearance order
        rows.append(tf.gather(by_key, position))
    return rows


def _hash_words(keys):
    """int32 [n, 2]: the low and high words of each key's hash (ops.key_row_map.key_hashes).

    A string's fingerprint bytes are cast to words directly: TensorFlow's graph optimizer merges
    a bitcast of the bitcast int64 fingerprint into one bitcast of the bytes, which it then
    rejects."""
    if keys.dtype == tf.string:
        return tf.bitcast(tf.reshape(tf.fingerprint(keys), [-1, 2, 4]), tf.int32)
    return tf.reshape(tf.bitcast(tf.cast(keys, tf.int64), tf.int32), [-1, 2])


def _string_bytes(strings):
    """int32 [total bytes, 1]: the bytes of `strings`, one after another."""
    pieces = tf.strings.bytes_split(strings).flat_values
    return tf.cast(tf.reshape(tf.io.decode_raw(pieces, tf.uint8), [-1, 1]), tf.int32)


def _strings_of(byte_values, lengths):
    """The strings of `lengths` bytes each, cut one after another from byte_values (int32)."""
    characters = tf.gather(tf.constant(_BYTE_STRINGS), byte_values)
    # validate=False: the lengths came with the bytes, and a validating RaggedTensor adds
    # stateful Assert ops, which must not follow a collective (ops/require.py).
    return tf.strings.reduce_join(
        tf.RaggedTensor.from_row_lengths(characters, lengths, validate=False), axis=1)
