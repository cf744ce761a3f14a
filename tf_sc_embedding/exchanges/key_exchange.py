"""Open-vocabulary keys to the replicas that own them, and their rows back
(docs/dynamic_vocabulary.md#several-replicas).

A dynamic table over W replicas keeps each key in the map of its owner shard
(ops.key_row_map.key_owner_shards). In a step every replica sends, per dynamic table, each
distinct key of its batch once, with the number of its occurrences, to the key's owner; the owner
maps what it receives (its map sees every occurrence over all replicas, so admission counts do
not depend on how the batch was split) and answers each key with its table row. For all tables
at once this costs one all-gather of the counts (and of the maps' last steps, so that every map
of a table maps the same step) and two all-to-alls:

1. `send_keys`: per table, the batch's distinct keys (first-appearance order) are grouped by
   owner (stable; int64 keys by one op, ops.key_row_map.group_keys_by_owner, strings by
   TensorFlow ops, as two strings may share a fingerprint) and sent as int32 triples (hash low
   word, high word, occurrences); string keys add their length, and their bytes go in the same
   all-to-all, one int32 each;
2. the owner receives, per table, the keys of every replica in replica order (`KeysAtOwner`);
3. `return_rows`: the owner's rows go back in the same chunks, and each replica spreads them
   over its occurrences.
"""
import collections

import tensorflow as tf

from tf_sc_embedding.exchanges import all_to_all
from tf_sc_embedding.ops.key_row_map import (KeysByOwner, group_keys_by_owner, key_hashes,
                                              key_owner_shards, repeat_indices)

# One table's keys as its owner receives them: keys [m] (int64, or strings), their occurrences in
# the senders' batches [m] int32, from replica 0's first to the last replica's last.
KeysAtOwner = collections.namedtuple("KeysAtOwner", ["keys", "counts"])
# What return_rows needs of send_keys: per table, each occurrence's index among the distinct
# keys sent (grouped by owner); the entries per (replica, table) sent and received, and the chunk
# of the answer (the largest number of keys one replica sends another).
KeyRoute = collections.namedtuple("KeyRoute", ["positions", "send_counts", "recv_counts",
                                               "answer_chunk"])

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
    positions, payloads, counts = [], [], []
    byte_payloads, byte_counts = [], []
    for keys in keys_by_table:
        strings = keys.dtype == tf.string
        grouped = (_group_strings_by_owner if strings else group_keys_by_owner)(keys, W)
        words = [_hash_words(grouped.keys), grouped.occurrences[:, None]]
        if strings:
            lengths = tf.strings.length(grouped.keys, unit="BYTE")
            words.append(lengths[:, None])
            byte_payloads.append(_string_bytes(grouped.keys))
            # Each owner's bytes: the keys come grouped by owner, owner_counts of them each.
            byte_counts.append(tf.reduce_sum(tf.RaggedTensor.from_row_lengths(
                lengths, grouped.owner_counts, validate=False), axis=1))
        positions.append(grouped.positions)
        payloads.append(tf.concat(words, axis=1))
        counts.append(grouped.owner_counts)
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
    return at_owner, KeyRoute(positions, send_counts[:, :T], recv_counts[:, :T],
                              answer_chunk), tf.unstack(steps, num=T)


def _group_strings_by_owner(keys, num_shards):
    """group_keys_by_owner's KeysByOwner for string keys, in TensorFlow ops, which compare the
    strings themselves (two may share a fingerprint)."""
    unique, position = tf.unique(keys, out_idx=tf.int32)
    occurrences = tf.math.unsorted_segment_sum(tf.ones_like(position), position, tf.size(unique))
    owners = key_owner_shards(key_hashes(unique), num_shards)
    order = tf.argsort(owners, stable=True)
    return KeysByOwner(
        tf.gather(unique, order), tf.gather(occurrences, order),
        tf.math.bincount(owners, minlength=num_shards, maxlength=num_shards, dtype=tf.int32),
        tf.gather(tf.math.invert_permutation(order), position))


def every_occurrence(keys, counts):
    """Each of `keys` repeated `counts` times, in order (what the owner's map steps through), by
    one pass over the counts (ops.key_row_map.repeat_indices; tf.repeat's [len(keys),
    max(counts)] mask made a hot key seen thousands of times in a batch cost up to 20 ms per
    table). A key with count 0 is skipped."""
    return tf.gather(keys, repeat_indices(counts))


def return_rows(view, route, rows_at_owner):
    """Per table, the row of every occurrence of this replica's keys (int32 [n]).

    rows_at_owner: per table, the owner's row for each key of send_keys' KeysAtOwner (int32
    [m])."""
    answers = all_to_all.unpack_by_replica(
        all_to_all.all_to_all_flat(view, all_to_all.pack_by_replica(
            list(rows_at_owner), route.recv_counts, route.answer_chunk)),
        route.send_counts, [None] * len(rows_at_owner))
    return [tf.gather(answer, position) for answer, position in zip(answers, route.positions)]


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
