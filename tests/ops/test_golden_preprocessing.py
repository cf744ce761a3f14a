"""The worked examples of docs/preprocessing.md#host-preprocessing, reproduced exactly through the TF ops.

Where TensorFlow leaves buffer tails uninitialized (docs/preprocessing.md#csr-wrapped-coo-buffers, docs/preprocessing.md#csr-buffers-with-minibatches) the spec values are compared on the
unpadded prefixes only, and our tails are additionally required to be PAD.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding import _core
from tf_sc_embedding import ops

from tests.reference import preprocessing as ref  # noqa: E402

PAD = ref.PAD
PAD_GAIN = ref.PAD_GAIN


def as_np(result):
    return [t.numpy() for t in result]


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#coo-conversion ConvertToCooTensor

SEC4_SPLITS = [0, 4, 4, 6, 8]
SEC4_VALUES = [5, 5, 2, 5, 7, 3, 1, 1]
SEC4_WEIGHTS = [1, 2, 1, 1, .5, .5, 1, 3]
SEC4_INDICES = [[0, 0], [0, 1], [0, 2], [0, 3], [2, 0], [2, 1], [3, 0], [3, 1]]
SEC4_GAINS = {
    "sum": [3, 1, 1, 0.5, 0.5, 4],
    "mean": [0.6, 0.2, 0.2, 0.5, 0.5, 1.0],
    "sqrtn": [1.1338935, 0.3779645, 0.3779645, 0.70710677, 0.70710677, 1.2649111],
}


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("form", ["ragged", "sparse"])
def test_sec4_convert_to_coo(combiner, form):
    index = SEC4_SPLITS if form == "ragged" else SEC4_INDICES
    rows, cols, gains = as_np(ops.convert_to_coo_tensor(
        tf.constant(index, tf.int32), tf.constant(SEC4_VALUES, tf.int32),
        tf.constant(SEC4_WEIGHTS, tf.float32), sample_count=4, combiner=combiner))
    np.testing.assert_array_equal(rows, [0, 0, 0, 2, 2, 3])
    np.testing.assert_array_equal(cols, [5, 2, 5, 7, 3, 1])
    # The spec's decimals are the shortest float32 representations: compare bit-exactly.
    np.testing.assert_array_equal(gains, np.array(SEC4_GAINS[combiner], np.float32))
    assert rows.dtype == np.int32 and cols.dtype == np.int32 and gains.dtype == np.float32
    expected = ref.convert_to_coo_tensor(index, SEC4_VALUES, np.float32(SEC4_WEIGHTS), 4, combiner)
    for got, want in zip((rows, cols, gains), expected):
        np.testing.assert_array_equal(got, want)


def test_sec4_mean_scales_match_spec():
    # scale per row for mean: row0 1/5, row2 1/1, row3 1/4; sqrtn: 1/sqrt(7), 1/sqrt(0.5), 1/sqrt(10)
    rows = ref.row_ids(SEC4_SPLITS, 8)
    np.testing.assert_array_equal(rows, [0, 0, 0, 0, 2, 2, 3, 3])
    w = np.float32(SEC4_WEIGHTS)
    mean = ref.combiner_scales(rows, w, 4, "mean")
    np.testing.assert_array_equal(mean, np.float32([1 / 5, 0, 1, 1 / 4]))
    sqrtn = ref.combiner_scales(rows, w, 4, "sqrtn")
    np.testing.assert_allclose(sqrtn, [1 / 7 ** .5, 0, 1 / .5 ** .5, 1 / 10 ** .5], rtol=1e-7)


def test_sec4_dense_case():
    rows, cols, gains = as_np(ops.convert_to_coo_tensor(
        tf.zeros([0], tf.int32), tf.constant([5, 5, 2, 9], tf.int32), tf.constant(1.0),
        sample_count=4, combiner="mean"))
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])
    np.testing.assert_array_equal(cols, [5, 5, 2, 9])
    np.testing.assert_array_equal(gains, [1, 1, 1, 1])


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform ConvertToListOfSparseCoreCooTensors: the user/video stacked table, one chip of two.

def ragged(samples):
    splits = np.concatenate([[0], np.cumsum([len(s) for s in samples])]).astype(np.int32)
    values = np.array([i for s in samples for i in s], np.int32)
    return splits, values


USER = [[0], [32, 1], [], [0], [9], [], [0], [0]]
VIDEO = [[3], [10, 3], [], [99], [0], [17], [3], [8]]
# (feature samples, row_offset, col_offset, col_shift)
FEATURES = {"f_user": (USER, 0, 0, 0), "f_video": (VIDEO, 8, 64, 4)}
S, C = 4, 2


def sec5_lists(name):
    samples, row_offset, col_offset, col_shift = FEATURES[name]
    splits, values = ragged(samples)
    return [[t.numpy() for t in group] for group in ops.convert_to_list_of_sparse_core_coo_tensors(
        tf.constant(splits), tf.constant(values), tf.constant(1.0), sample_count=8,
        num_sc_per_chip=S, row_offset=row_offset, col_offset=col_offset, col_shift=col_shift,
        num_sc_shards=S * C, stacked_table_sample_count=16, combiner="sum",
        vocabulary_size=100 if name == "f_video" else 33, table_name="user_video",
        feature_name=name)]


def test_sec5_video_col_transform():
    raw = np.array([3, 10, 99, 0, 17, 8])
    col = ref.stacked_col(raw, 64, 4, 8)
    np.testing.assert_array_equal(col, [71, 78, 167, 68, 85, 76])
    np.testing.assert_array_equal(col % 8, [7, 6, 7, 4, 5, 4])
    np.testing.assert_array_equal(col // 8, [8, 9, 20, 8, 10, 9])


@pytest.mark.parametrize("name,rows,cols", [
    ("f_user", [[0, 1, 1], [5], [8], [12, 13]], [[0, 32, 1], [0], [9], [0, 0]]),
    ("f_video", [[2, 3, 3], [7], [10, 11], [14, 15]], [[71, 78, 71], [167], [68, 85], [71, 76]]),
])
def test_sec5_list_of_coo(name, rows, cols):
    got_rows, got_cols, got_gains = sec5_lists(name)
    assert len(got_rows) == len(got_cols) == len(got_gains) == S
    for i in range(S):
        np.testing.assert_array_equal(got_rows[i], rows[i])
        np.testing.assert_array_equal(got_cols[i], cols[i])
        np.testing.assert_array_equal(got_gains[i], np.ones(len(rows[i]), np.float32))


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#sort-dedup-and-bucket SortListOfSparseCoreCooTensors and docs/preprocessing.md#id-statistics GetStats

SEC6 = {  # SC: (sorted_row_ids, sorted_col_ids, id_counts)
    0: ([0, 1, 1, 3, 2, 3], [0, 4, 0, 9, 8, 8], [0, 2, 3, 3, 3, 3, 3, 4, 6]),
    1: ([1, 3], [0, 20], [0, 1, 1, 1, 1, 1, 1, 1, 2]),
    2: ([0, 2, 3], [1, 8, 10], [0, 0, 1, 1, 1, 2, 3, 3, 3]),
    3: ([0, 1, 3, 2], [0, 0, 9, 8], [0, 2, 2, 2, 2, 3, 3, 3, 4]),
}
SORT_ATTRS = dict(sample_count_list=[2, 2], col_offset_list=[0, 64], num_replica=C,
                  table_vocab_size=192, feature_width=16, num_sc_per_chip=S,
                  table_name="user_video")


def sec6_sorted():
    user, video = sec5_lists("f_user"), sec5_lists("f_video")
    out = []
    for i in range(S):
        out.append(as_np(ops.sort_list_of_sparse_core_coo_tensors(
            [user[0][i], video[0][i]], [user[1][i], video[1][i]], [user[2][i], video[2][i]],
            max_ids_per_sparse_core=256, max_unique_ids_per_sparse_core=256, **SORT_ATTRS)))
    return out


def test_sec6_sort_list():
    for i, (rows, cols, gains, id_counts) in enumerate(sec6_sorted()):
        np.testing.assert_array_equal(rows, SEC6[i][0])
        np.testing.assert_array_equal(cols, SEC6[i][1])
        np.testing.assert_array_equal(id_counts, SEC6[i][2])
        np.testing.assert_array_equal(gains, np.ones(len(rows), np.float32))


def test_sec6_sort_list_limits_are_inclusive():
    # SC0 has 2 ids (2 unique) on replica 0 and 2 ids (1 unique) on replica 7: limits of 2 pass.
    user, video = sec5_lists("f_user"), sec5_lists("f_video")
    rows, cols, _, id_counts = as_np(ops.sort_list_of_sparse_core_coo_tensors(
        [user[0][0], video[0][0]], [user[1][0], video[1][0]], [user[2][0], video[2][0]],
        max_ids_per_sparse_core=2, max_unique_ids_per_sparse_core=2, **SORT_ATTRS))
    np.testing.assert_array_equal(id_counts, SEC6[0][2])


def test_sec7_stats():
    user, video = sec5_lists("f_user"), sec5_lists("f_video")
    # Per SC (max ids, max uniques) over the 8 target replicas, counted by hand from docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform:
    # SC0: replica 0 holds cols 0 and 32 (2 ids, 2 unique), replica 7 holds col 71 twice.
    # SC3: replica 0 holds col 0 for rows 12 and 13 (2 ids, 1 unique).
    expected = {0: (2, 2), 1: (1, 1), 2: (1, 1), 3: (2, 1)}
    stats = []
    for i in range(S):
        got = ops.get_stats_from_list_of_sparse_core_coo_tensors(
            [user[0][i], video[0][i]], [user[1][i], video[1][i]], [user[2][i], video[2][i]],
            **SORT_ATTRS)
        got = tuple(int(t.numpy()) for t in got)
        assert got == expected[i], i
        stats.append(got)
    # Python takes the elementwise maximum over the SparseCores.
    assert tuple(np.max(stats, axis=0)) == (2, 2)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-wrapped-coo-buffers ConvertToSparseCoreCsrWrappedCooTensor

SEC8_BLOCKS = [[2, 9, 16, 16, 16, 16, 17, 26], [33, 40, 40, 40, 40, 40, 40, 41],
               [48, 49, 56, 56, 57, 65, 72, 72], [74, 80, 80, 80, 81, 88, 88, 89]]


def test_sec8_csr_wrapped():
    sorted_lists = sec6_sorted()
    result = ops.convert_to_sparse_core_csr_wrapped_coo_tensor(
        [s[0] for s in sorted_lists], [s[1] for s in sorted_lists], [s[2] for s in sorted_lists],
        [s[3] for s in sorted_lists], tf.constant(0, tf.int64), sample_count_per_sc=4,
        num_replica=C, max_minibatches_per_sc=1, max_ids_per_chip_per_sample=8,
        table_vocab_size=192, feature_width=16, table_name="user_video", allow_id_dropping=False)
    row_pointers = result.row_pointers.numpy()
    samples = result.sorted_sample_ids.numpy()
    tokens = result.sorted_token_ids.numpy()
    gains = result.sorted_gains.numpy()
    assert row_pointers.shape == (32,) and samples.shape == tokens.shape == gains.shape == (128,)
    assert int(result.row_pointers_unpadded_size) == 32
    assert int(result.ids_unpadded_size) == 96
    assert int(result.num_minibatches_per_sc) == 1
    assert int(result.num_dropped_ids) == 0
    np.testing.assert_array_equal(row_pointers, np.concatenate(SEC8_BLOCKS))

    P_ = PAD
    want_samples = [0, 1] + [P_] * 6 + [1] + [P_] * 7 + [3] + [P_] * 7 + [2, 3] + [P_] * 6
    want_tokens = [0, 4] + [P_] * 6 + [0] + [P_] * 7 + [9] + [P_] * 7 + [8, 8] + [P_] * 6
    np.testing.assert_array_equal(samples[:32], want_samples)
    np.testing.assert_array_equal(tokens[:32], want_tokens)
    want_gains = np.where(np.array(want_tokens) == PAD, PAD_GAIN, np.float32(1))
    np.testing.assert_array_equal(gains[:32], want_gains)
    assert gains[2] == np.float32(2147483648.0)
    # Our tails (TF: uninitialized) are PAD.
    assert (samples[96:] == PAD).all() and (tokens[96:] == PAD).all()
    assert (gains[96:] == PAD_GAIN).all()
    # The whole buffer agrees with the reference packer.
    want = ref.convert_to_sparse_core_csr_wrapped_coo_tensor(
        [s[0] for s in sorted_lists], [s[1] for s in sorted_lists], [s[2] for s in sorted_lists],
        [s[3] for s in sorted_lists], 0, 4, C, S, 1, 8, False)
    np.testing.assert_array_equal(row_pointers, want["row_pointers"])
    np.testing.assert_array_equal(samples, want["sorted_sample_ids"])
    np.testing.assert_array_equal(tokens, want["sorted_token_ids"])
    np.testing.assert_array_equal(gains, want["sorted_gains"])


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#split-encoding split encoding

SPLIT_EXAMPLES = [(1 << 0, [32]), (1 << 1, [16]), (1 << 2, [48]), (1 << 3, [8]), (13, [8, 32, 48])]


@pytest.mark.parametrize("bits,points", SPLIT_EXAMPLES)
def test_sec9_3_split_encoding(bits, points):
    assert ref.bits_to_bucket_splits(bits, 6) == points
    assert ref.bucket_splits_to_bits(points, 6) == bits
    assert list(_core.binary_to_bucket_splits(bits, 6)) == points
    assert _core.bucket_splits_to_binary(points, 6) == bits


@pytest.mark.parametrize("bits,points", SPLIT_EXAMPLES + [(0, [])])
def test_sec9_3_split_encoding_through_csr_op(bits, points):
    # One shard and one SparseCore; division d holds exactly one id, token d. Minibatch m must
    # then hold tokens [split[m-1], split[m]).
    D = 64
    result = ops.convert_to_sparse_core_csr_wrapped_coo_tensor(
        [np.zeros(D, np.int32)], [np.arange(D, dtype=np.int32)], [np.ones(D, np.float32)],
        [np.arange(D + 1, dtype=np.int32)], tf.constant([bits, 0], tf.int64),
        sample_count_per_sc=1, num_replica=1, max_minibatches_per_sc=8,
        max_ids_per_chip_per_sample=128, table_vocab_size=D, feature_width=1, table_name="t",
        allow_id_dropping=False)
    bounds = [0] + points + [D]
    assert int(result.num_minibatches_per_sc) == len(bounds) - 1
    tokens = result.sorted_token_ids.numpy()
    row_pointers = result.row_pointers.numpy()
    start = 0
    for m in range(len(bounds) - 1):
        end = row_pointers[8 * m]  # one shard: the block's first entry ends the segment
        np.testing.assert_array_equal(tokens[start:end], np.arange(bounds[m], bounds[m + 1]))
        start = ref.round_up(end, 8)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#minibatch-split-search GetMinibatchSplitsWithPhysicalReplica

SEC9_ROWS = [0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 7]
SEC9_COLS = [0, 8, 40, 44, 48, 44, 5, 2, 6, 10, 3, 63]
SEC9_GAINS = [1, 1, 1, 1, 1, .5, 1, 1, 1, 1, 1, 1]
SEC9_ATTRS = dict(sample_count=8, num_replica=1, table_vocab_size=64, feature_width=8,
                  num_sc_per_chip=4, table_name="t", max_ids_per_partition=2,
                  max_unique_ids_per_partition=2, max_division_level=6)


def sec9_outputs():
    return ops.get_minibatch_splits_with_physical_replica(
        tf.constant(["key"]), tf.constant(SEC9_ROWS, tf.int32), tf.constant(SEC9_COLS, tf.int32),
        tf.constant(SEC9_GAINS, tf.float32), mini_batch_splits="", **SEC9_ATTRS)


def test_sec9_4_minibatch_splits():
    rows, cols, gains, splits, id_counts, max_ids, max_uniques = as_np(sec9_outputs())
    assert splits.dtype == np.int64 and int(splits) == 13
    assert ref.bits_to_bucket_splits(int(splits), 6) == [8, 32, 48]
    assert int(max_ids) == 5 and int(max_uniques) == 5
    np.testing.assert_array_equal(rows, [0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(cols, [0, 2, 10, 11, 12, 1, 0, 1, 2, 0, 15])
    np.testing.assert_array_equal(gains, np.float32([1, 1, 1, 1.5, 1, 1, 1, 1, 1, 1, 1]))
    steps = {1: 1, 9: 2, 41: 3, 45: 4, 49: 5, 70: 6, 387: 7, 391: 8, 395: 9, 708: 10, 1024: 11}
    assert id_counts.shape == (64 * 4 * 4 + 1,)
    want = np.zeros(1025, np.int32)
    for index, value in steps.items():
        want[index:] = value
    np.testing.assert_array_equal(id_counts, want)
    expected = ref.get_minibatch_splits_with_physical_replica(
        SEC9_ROWS, SEC9_COLS, np.float32(SEC9_GAINS), 8, 1, 4, 64, 2, 2)
    assert expected["splits"] == 13
    np.testing.assert_array_equal(expected["id_counts"], want)
    np.testing.assert_array_equal(expected["sorted_col_ids"], cols)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-buffers-with-minibatches GetMinibatchesInCsrWithPhysicalReplica

SEC10_BLOCKS = {  # (SC, minibatch): listed entries; the block continues with its last value
    (0, 0): [1, 9, 16, 16, 16, 16, 16, 16], (0, 1): [17, 24], (0, 2): [26, 32], (0, 3): [33, 40],
    (1, 0): [40, 40, 42, 48], (1, 1): [48, 48, 49, 56], (2, 0): [56, 56, 56, 57, 64],
    (3, 3): [64, 64, 64, 65, 72],
}
SEC10_SLOTS = {  # slot: (token, sample, gain)
    0: (0, 0, 1), 8: (1, 1, 1), 16: (2, 0, 1), 24: (10, 0, 1), 25: (11, 1, 1.5), 32: (12, 1, 1),
    40: (0, 0, 1), 41: (1, 0, 1), 48: (2, 1, 1), 56: (0, 0, 1), 64: (15, 1, 1),
}


def test_sec10_minibatches_in_csr():
    rows, cols, gains, splits, id_counts, _, _ = sec9_outputs()
    result = ops.get_minibatches_in_csr_with_physical_replica(
        tf.constant(["key"]), rows, cols, gains, splits, id_counts, sample_count=8, num_replica=1,
        max_minibatches_per_sc=8, max_ids_per_chip_per_sample=16, table_vocab_size=64,
        feature_width=8, num_sc_per_chip=4, table_name="t", mini_batch_in_csr="")
    assert int(result.num_minibatches_per_physical_sparse_core) == 4
    assert int(result.row_pointers_unpadded_size) == 128
    assert int(result.ids_unpadded_size) == 72
    assert int(result.num_dropped_ids) == 0
    row_pointers = result.row_pointers.numpy()
    tokens = result.sorted_token_ids.numpy()
    samples = result.sorted_sample_ids.numpy()
    out_gains = result.sorted_gains.numpy()
    assert row_pointers.shape == (8 * 4 * 8,) and tokens.shape == (128,)
    for (sc, minibatch), listed in SEC10_BLOCKS.items():
        block = listed + [listed[-1]] * (8 - len(listed))
        start = (sc * 4 + minibatch) * 8
        np.testing.assert_array_equal(row_pointers[start:start + 8], block, err_msg=str(sc))
    for slot in range(72):
        if slot in SEC10_SLOTS:
            token, sample, gain = SEC10_SLOTS[slot]
            assert (tokens[slot], samples[slot], out_gains[slot]) == (token, sample,
                                                                      np.float32(gain)), slot
        else:
            assert (tokens[slot], samples[slot], out_gains[slot]) == (PAD, PAD, PAD_GAIN), slot
    # Our tails (TF: uninitialized) are PAD.
    assert (row_pointers[128:] == PAD).all()
    assert (tokens[72:] == PAD).all() and (samples[72:] == PAD).all()
    assert (out_gains[72:] == PAD_GAIN).all()
    want = ref.get_minibatches_in_csr_with_physical_replica(
        rows.numpy(), cols.numpy(), gains.numpy(), int(splits), id_counts.numpy(), 8, 1, 4, 8, 16)
    np.testing.assert_array_equal(row_pointers, want["row_pointers"])
    np.testing.assert_array_equal(tokens, want["sorted_token_ids"])
    np.testing.assert_array_equal(samples, want["sorted_sample_ids"])
    np.testing.assert_array_equal(out_gains, want["sorted_gains"])
