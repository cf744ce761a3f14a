"""Bad inputs to the preprocessing ops fail cleanly, with messages that say what is wrong.

Every case must raise InvalidArgumentError (FailedPreconditionError for a non-power-of-two shard
count in the sort/stats ops, docs/preprocessing.md#invalid-inputs) and leave the process alive. Where tf_sc_embedding validates
more than TensorFlow does (negative / out-of-range ids, sparse indices shape, row_splits contents,
divisibility, CSR minibatch limit), the message is checked the same way.
"""
import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding import ops

InvalidArgument = tf.errors.InvalidArgumentError
FailedPrecondition = tf.errors.FailedPreconditionError


def coo(index, values, weights, sample_count=4, combiner="sum", **kwargs):
    return ops.convert_to_coo_tensor(np.asarray(index, np.int32), np.asarray(values, np.int32),
                                     np.asarray(weights, np.float32), sample_count=sample_count,
                                     combiner=combiner, **kwargs)


def to_list(index, values, weights=1.0, sample_count=4, num_sc_per_chip=2, row_offset=0,
            col_offset=0, col_shift=0, num_sc_shards=4, stacked_table_sample_count=None,
            **kwargs):
    return ops.convert_to_list_of_sparse_core_coo_tensors(
        np.asarray(index, np.int32), np.asarray(values, np.int32), np.asarray(weights, np.float32),
        sample_count=sample_count, num_sc_per_chip=num_sc_per_chip, row_offset=row_offset,
        col_offset=col_offset, col_shift=col_shift, num_sc_shards=num_sc_shards,
        stacked_table_sample_count=stacked_table_sample_count or sample_count, combiner="sum",
        **kwargs)


CONVERTERS = {"coo": coo, "list": to_list}
GOOD_SPLITS = [0, 1, 1, 3, 4]


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#from-ids-to-coo-entries / docs/preprocessing.md#coo-conversion / docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform: ids and input shapes (both ConvertTo* ops share the validation)


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
@pytest.mark.parametrize("vocabulary_size", [-1, 10])
def test_negative_id_names_table_and_feature(convert, vocabulary_size):
    with pytest.raises(InvalidArgument,
                       match=r"table 'video', feature 'f_video'.*id -3 at position 2"):
        convert(GOOD_SPLITS, [1, 2, -3, 4], [1, 1, 1, 1], vocabulary_size=vocabulary_size,
                table_name="video", feature_name="f_video")


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
def test_id_at_or_above_vocabulary_size_names_table_and_feature(convert):
    with pytest.raises(InvalidArgument,
                       match=r"table 'user', feature 'f_user'.*id 10 .*out of range \[0, 10\)"):
        convert(GOOD_SPLITS, [1, 9, 10, 4], [1, 1, 1, 1], vocabulary_size=10, table_name="user",
                feature_name="f_user")
    # The largest valid id passes.
    convert(GOOD_SPLITS, [1, 9, 9, 4], [1, 1, 1, 1], vocabulary_size=10)


def test_negative_id_in_dense_and_sparse_input():
    with pytest.raises(InvalidArgument, match="table 't', feature 'f'.*-1"):
        coo(np.zeros([0]), [0, 1, -1, 2], 1.0, table_name="t", feature_name="f")
    with pytest.raises(InvalidArgument, match="table 't', feature 'f'.*-7"):
        coo([[0, 0], [2, 0]], [3, -7], 1.0, table_name="t", feature_name="f")


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
def test_weights_count_differs_from_values(convert):
    with pytest.raises(InvalidArgument, match="weights has 3 elements but values has 4"):
        convert(GOOD_SPLITS, [1, 2, 3, 4], [1, 1, 1])


def test_weights_rank_two():
    with pytest.raises(InvalidArgument, match="weights must be a scalar or rank 1, got rank 2"):
        coo(GOOD_SPLITS, [1, 2, 3, 4], [[1, 1, 1, 1]])


def test_values_rank_two():
    with pytest.raises(InvalidArgument, match="values must be rank 1, got rank 2"):
        coo(GOOD_SPLITS, [[1, 2, 3, 4]], 1.0)


def test_indices_rank_three():
    with pytest.raises(InvalidArgument, match="invalid indices_or_row_splits of rank 3"):
        coo(np.zeros([4, 2, 1]), [1, 2, 3, 4], 1.0)


def test_scalar_indices():
    with pytest.raises(InvalidArgument, match="invalid indices_or_row_splits of rank 0"):
        coo(np.int32(0), [1, 2, 3, 4], 1.0)


def test_dense_count_differs_from_sample_count():
    with pytest.raises(InvalidArgument, match="dense input has 3 ids but sample_count is 4"):
        coo(np.zeros([0]), [1, 2, 3], 1.0)


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
def test_sparse_indices_rows_differ_from_values(convert):
    with pytest.raises(InvalidArgument, match="sparse indices has 3 rows but values has 4"):
        convert([[0, 0], [1, 0], [2, 0]], [1, 2, 3, 4], 1.0)
    with pytest.raises(InvalidArgument, match="sparse indices has 0 rows but values has 4"):
        convert(np.zeros([0, 2]), [1, 2, 3, 4], 1.0)


def test_sparse_indices_need_two_columns():
    with pytest.raises(InvalidArgument, match="must have 2 columns.*got 3"):
        coo([[0, 0, 0], [1, 0, 0]], [1, 2], 1.0)
    with pytest.raises(InvalidArgument, match="must have 2 columns.*got 1"):
        coo([[0], [1]], [1, 2], 1.0)


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
def test_unsorted_sparse_indices(convert):
    with pytest.raises(InvalidArgument, match=r"need to be sorted in ascending \(non-decreasing\)"):
        convert([[0, 0], [2, 0], [1, 0]], [1, 2, 3], 1.0)


def test_negative_sparse_row():
    with pytest.raises(InvalidArgument, match="sorted"):
        coo([[-1, 0], [0, 0]], [1, 2], 1.0)


def test_sparse_row_not_below_sample_count():
    with pytest.raises(InvalidArgument, match="row 4 at position 1 is not below sample_count 4"):
        coo([[0, 0], [4, 0]], [1, 2], 1.0)


@pytest.mark.parametrize("convert", CONVERTERS.values(), ids=CONVERTERS.keys())
@pytest.mark.parametrize("splits,message", [
    ([0, 1, 3, 4], r"row_splits has 4 elements but sample_count \+ 1 = 5"),
    ([0, 1, 1, 3, 4, 4], r"row_splits has 6 elements but sample_count \+ 1 = 5"),
    ([1, 1, 1, 3, 4], "row_splits must start at 0, got 1"),
    ([-1, 1, 1, 3, 4], "row_splits must start at 0, got -1"),
    ([0, 2, 1, 3, 4], r"non-decreasing, but row_splits\[2\] = 1 < row_splits\[1\] = 2"),
    ([0, 1, 1, 3, 3], "row_splits ends at 3 but values has 4 elements"),
    ([0, 1, 1, 3, 5], "row_splits ends at 5 but values has 4 elements"),
    ([0, 1, 1, 3, 2147483647], "ends at 2147483647"),
])
def test_bad_row_splits(convert, splits, message):
    with pytest.raises(InvalidArgument, match=message):
        convert(splits, [1, 2, 3, 4], 1.0)


def test_invalid_combiner():
    with pytest.raises(InvalidArgument, match="combiner"):
        coo(GOOD_SPLITS, [1, 2, 3, 4], 1.0, combiner="max")


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform list op attributes


@pytest.mark.parametrize("shards", [3, 6, 12])
def test_list_num_sc_shards_not_power_of_two(shards):
    with pytest.raises(InvalidArgument, match=f"num_sc_shards must be a power of two, got {shards}"):
        to_list(GOOD_SPLITS, [1, 2, 3, 4], num_sc_shards=shards)


@pytest.mark.parametrize("attrs", [
    dict(sample_count=3, num_sc_per_chip=2),
    dict(sample_count=4, num_sc_per_chip=2, row_offset=1, stacked_table_sample_count=8),
    dict(sample_count=4, num_sc_per_chip=2, stacked_table_sample_count=7),
    dict(sample_count=4, num_sc_per_chip=8),
])
def test_list_counts_not_divisible_by_sparse_cores(attrs):
    splits = list(range(attrs["sample_count"] + 1))
    with pytest.raises(InvalidArgument, match="must be divisible by the number of SparseCores"):
        to_list(splits, list(range(attrs["sample_count"])), **attrs)


def test_list_feature_does_not_fit_stacked_batch():
    with pytest.raises(InvalidArgument, match=r"row_offset \+ sample_count \(8\) exceeds "
                                              r"stacked_table_sample_count \(6\)"):
        to_list(GOOD_SPLITS, [1, 2, 3, 4], row_offset=4, stacked_table_sample_count=6)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#sort-dedup-and-bucket / docs/preprocessing.md#id-statistics sort and stats

def sort_args(rows=([0, 1, 1],), cols=([0, 4, 8],), gains=None, **overrides):
    gains = gains or tuple([1.0] * len(c) for c in cols)
    args = dict(row_ids_list=[np.asarray(r, np.int32) for r in rows],
                col_ids_list=[np.asarray(c, np.int32) for c in cols],
                gains_list=[np.asarray(g, np.float32) for g in gains],
                sample_count_list=[2] * len(rows), col_offset_list=[0] * len(rows),
                num_replica=1, table_vocab_size=64, feature_width=8, num_sc_per_chip=4,
                table_name="video_table")
    args.update(overrides)
    return args


def sort(**kwargs):
    args = sort_args(**kwargs)
    args.setdefault("max_ids_per_sparse_core", 256)
    args.setdefault("max_unique_ids_per_sparse_core", 256)
    return ops.sort_list_of_sparse_core_coo_tensors(**args)


@pytest.mark.parametrize("replicas,cores", [(3, 1), (1, 3), (3, 4), (1, 6)])
def test_sort_and_stats_shards_not_power_of_two(replicas, cores):
    with pytest.raises(FailedPrecondition, match=f"table 'video_table'.*\\({replicas * cores}\\) "
                                                 "must be a power of two"):
        sort(num_replica=replicas, num_sc_per_chip=cores)
    with pytest.raises(FailedPrecondition, match="must be a power of two"):
        ops.get_stats_from_list_of_sparse_core_coo_tensors(
            **sort_args(num_replica=replicas, num_sc_per_chip=cores))


def test_sort_too_many_ids_for_a_sparse_core():
    # cols 0, 4, 8 all go to shard 0 (P = 4): 3 ids, 3 unique.
    sort(max_ids_per_sparse_core=3, max_unique_ids_per_sparse_core=3)
    with pytest.raises(InvalidArgument, match="table 'video_table': sparse core 0 gets 3 ids while "
                                              "the max ids per sparse core is set to be 2"):
        sort(max_ids_per_sparse_core=2)
    with pytest.raises(InvalidArgument, match="table 'video_table': sparse core 0 gets 3 unique "
                                              "ids while the max unique ids per sparse core is "
                                              "set to be 2"):
        sort(max_unique_ids_per_sparse_core=2)


def test_sort_limit_counts_ids_after_dedup():
    # (row 1, col 5) three times is one id; shard 1 gets 2 ids with 1 unique col.
    rows, cols = ([0, 1, 1, 1],), ([5, 5, 5, 5],)
    sort(rows=rows, cols=cols, max_ids_per_sparse_core=2, max_unique_ids_per_sparse_core=1)
    with pytest.raises(InvalidArgument, match="sparse core 1 gets 2 ids"):
        sort(rows=rows, cols=cols, max_ids_per_sparse_core=1)


@pytest.mark.parametrize("limit", ["max_ids_per_sparse_core", "max_unique_ids_per_sparse_core"])
def test_sort_limits_must_be_positive(limit):
    with pytest.raises(InvalidArgument, match=f"{limit}.*must be at least minimum 1"):
        sort(**{limit: 0})


@pytest.mark.parametrize("lists", [
    dict(rows=([0, 1, 1],), cols=([0, 4],)),
    dict(rows=([0, 1],), cols=([0, 4],), gains=([1.0],)),
])
def test_sort_and_stats_mismatched_lengths(lists):
    with pytest.raises(InvalidArgument, match="table 'video_table': feature 0 has .* they must "
                                              "match"):
        sort(**lists)
    with pytest.raises(InvalidArgument, match="they must match"):
        ops.get_stats_from_list_of_sparse_core_coo_tensors(**sort_args(**lists))


def test_sort_negative_col_or_row():
    with pytest.raises(InvalidArgument, match="table 'video_table': negative id or row"):
        sort(cols=([0, -4, 8],))
    with pytest.raises(InvalidArgument, match="negative id or row"):
        sort(rows=([0, -1, 1],))


def test_sort_attribute_lists_must_have_one_entry_per_feature():
    with pytest.raises(InvalidArgument, match="sample_count_list and col_offset_list must have 1 "
                                              "entries"):
        sort(sample_count_list=[2, 2])
    with pytest.raises(InvalidArgument, match="sample_count_list and col_offset_list"):
        sort(col_offset_list=[])


def test_sort_inputs_must_be_vectors():
    with pytest.raises(InvalidArgument, match="must be rank 1"):
        sort(rows=([[0, 1, 1]],))


def test_sort_list_lengths_must_agree():
    # TensorFlow's op-definition layer rejects lists of different lengths before the kernel runs
    # (ValueError from the Python op library or InvalidArgument from the eager fast path).
    with pytest.raises((ValueError, InvalidArgument), match="must match length|do not match"):
        sort(rows=([0], [0]), cols=([0],), gains=([1.0],), sample_count_list=[2],
             col_offset_list=[0])


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-wrapped-coo-buffers CSR-wrapped COO


def csr_args(S=2, C=1, rows=None, cols=None, counts=None, **overrides):
    """Two SCs, two shards; SC s has 3 ids: 2 on shard 0 and 1 on shard 1."""
    P = S * C
    rows = rows or [[0, 1, 0]] * S
    cols = cols or [[0, 1, 2]] * S
    counts = counts or [[0, 2] + [3] * (P - 1)] * S
    args = dict(sorted_row_ids_list=[np.asarray(r, np.int32) for r in rows],
                sorted_col_ids_list=[np.asarray(c, np.int32) for c in cols],
                sorted_gains_list=[np.ones(len(r), np.float32) for r in rows],
                id_counts_list=[np.asarray(c, np.int32) for c in counts],
                splits=np.int64(0), sample_count_per_sc=4, num_replica=C,
                max_minibatches_per_sc=1, max_ids_per_chip_per_sample=8, table_vocab_size=64,
                feature_width=8, table_name="big_table", allow_id_dropping=False)
    args.update(overrides)
    return args


def csr(**kwargs):
    return ops.convert_to_sparse_core_csr_wrapped_coo_tensor(**csr_args(**kwargs))


def test_csr_wrapped_good_arguments_pass():
    result = csr()
    assert int(result.ids_unpadded_size) == 32  # 2 SCs x 2 shards x one 8-slot segment


@pytest.mark.parametrize("size", [1, 2, 4, 64, 130])
def test_csr_wrapped_id_counts_size(size):
    # P = 2, D = 64: P + 1 = 3 or P * D + 1 = 129 elements.
    with pytest.raises(InvalidArgument, match=f"big_table.*id_counts of sparse core 0 has {size} "
                                              "elements, expected 3 or 129"):
        csr(counts=[list(range(size))] * 2)


def test_csr_wrapped_empty_id_counts():
    with pytest.raises(InvalidArgument, match="id_counts must not be empty"):
        csr(counts=[[], []])


def test_csr_wrapped_id_counts_beyond_data():
    with pytest.raises(InvalidArgument, match="id_counts of sparse core 1 ends at 4 but only 3 ids "
                                              "were given"):
        csr(counts=[[0, 2, 3], [0, 2, 4]])


def test_csr_wrapped_decreasing_id_counts():
    with pytest.raises(InvalidArgument, match="must be non-decreasing"):
        csr(counts=[[0, 2, 1], [0, 2, 3]])
    with pytest.raises(InvalidArgument, match="must start at a value >= 0"):
        csr(counts=[[-1, 2, 3], [0, 2, 3]])


def test_csr_wrapped_mixed_id_counts_layouts():
    with pytest.raises(InvalidArgument, match="same id_counts layout"):
        csr(counts=[[0, 2, 3], [0] * 64 + [2] * 64 + [3]])


def test_csr_wrapped_mismatched_lengths():
    args = csr_args()
    args["sorted_gains_list"][1] = np.ones(2, np.float32)
    with pytest.raises(InvalidArgument, match="sparse core 1 has 3 row ids, 3 col ids and 2 gains"):
        ops.convert_to_sparse_core_csr_wrapped_coo_tensor(**args)


def test_csr_wrapped_list_lengths_must_agree():
    args = csr_args()
    args["sorted_col_ids_list"] = args["sorted_col_ids_list"][:1]
    with pytest.raises((ValueError, InvalidArgument), match="must match length|do not match"):
        ops.convert_to_sparse_core_csr_wrapped_coo_tensor(**args)


def test_csr_wrapped_rank_two_input():
    args = csr_args()
    args["sorted_row_ids_list"][0] = args["sorted_row_ids_list"][0].reshape(1, 3)
    with pytest.raises(InvalidArgument, match="sorted_row_ids must be rank 1, got rank 2"):
        ops.convert_to_sparse_core_csr_wrapped_coo_tensor(**args)


def test_csr_wrapped_buffer_not_multiple_of_eight():
    # MAXC = 1 * 3 * 2 = 6.
    with pytest.raises(InvalidArgument, match=r"id buffer size \(6\) must be a non-negative "
                                              "multiple of 8"):
        csr(max_ids_per_chip_per_sample=1, sample_count_per_sc=3)


def test_csr_wrapped_overflow_without_dropping():
    # 4 segments of 8 slots need 32 > MAXC = 1 * 8 * 2 = 16: the 3rd segment does not fit.
    with pytest.raises(InvalidArgument, match="big_table.*does not fit all ids.*allow_id_dropping"):
        csr(max_ids_per_chip_per_sample=1, sample_count_per_sc=8)


def test_csr_wrapped_overflow_with_dropping_counts_dropped_ids():
    # MAXC = 16: SC0 takes slots 0-1 (shard 0) and 8 (shard 1), padded to 16; SC1's 3 ids drop.
    result = csr(max_ids_per_chip_per_sample=1, sample_count_per_sc=8, allow_id_dropping=True)
    assert int(result.num_dropped_ids) == 3
    assert int(result.ids_unpadded_size) == 16
    np.testing.assert_array_equal(result.row_pointers.numpy()[:16],
                                  [2, 9] + [16] * 6 + [16] * 8)
    # MAXC = 24 with 10 ids in SC1 shard 0: 8 fit after the 16 used by SC0, 2 + 1 drop.
    rows = [[0, 1, 0], [0] * 10 + [1]]
    cols = [[0, 1, 2], list(range(11))]
    result = csr(rows=rows, cols=cols, counts=[[0, 2, 3], [0, 10, 11]],
                 max_ids_per_chip_per_sample=3, sample_count_per_sc=4, allow_id_dropping=True)
    assert int(result.num_dropped_ids) == 3
    assert int(result.ids_unpadded_size) == 24
    np.testing.assert_array_equal(result.sorted_token_ids.numpy()[16:24], range(8))


def test_csr_wrapped_exact_fit_drops_nothing():
    # 4 segments of at most 8 ids fill MAXC = 32 exactly.
    result = csr(max_ids_per_chip_per_sample=4, sample_count_per_sc=4, allow_id_dropping=True)
    assert int(result.num_dropped_ids) == 0
    assert int(result.ids_unpadded_size) == 32


def test_csr_wrapped_too_many_minibatches():
    # splits = 0b101 -> split points [32, 48]: 3 minibatches.
    with pytest.raises(InvalidArgument, match="big_table.*number of minibatches per sparse core is "
                                              "3, but max_minibatches_per_sc is set to 2"):
        csr(splits=np.array([1, 4], np.int64), max_minibatches_per_sc=2,
            max_ids_per_chip_per_sample=64)
    result = csr(splits=np.array([1, 4], np.int64), max_minibatches_per_sc=3,
                 max_ids_per_chip_per_sample=64)
    assert int(result.num_minibatches_per_sc) == 3


def test_csr_wrapped_bad_division_level():
    with pytest.raises(InvalidArgument, match="max_division_level must be in"):
        csr(max_division_level=7)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#minibatching minibatch splits

def splits_op(rows=(0, 0, 1, 2), cols=(1, 5, 9, 3), gains=None, **overrides):
    args = dict(sample_count=4, num_replica=1, table_vocab_size=64, feature_width=8,
                num_sc_per_chip=2, table_name="ads_table", mini_batch_splits="",
                max_ids_per_partition=8, max_unique_ids_per_partition=8)
    args.update(overrides)
    gains = gains if gains is not None else [1.0] * len(rows)
    return ops.get_minibatch_splits_with_physical_replica(
        ["key"], np.asarray(rows, np.int32), np.asarray(cols, np.int32),
        np.asarray(gains, np.float32), **args)


def test_splits_good_arguments_pass():
    assert int(splits_op()[3]) == 0


@pytest.mark.parametrize("sample_count,cores", [(5, 2), (4, 8), (6, 4)])
def test_splits_sample_count_not_divisible(sample_count, cores):
    with pytest.raises(InvalidArgument, match=f"ads_table.*sample_count \\({sample_count}\\) must "
                                              f"be a positive multiple of num_sc_per_chip "
                                              f"\\({cores}\\)"):
        splits_op(sample_count=sample_count, num_sc_per_chip=cores)


@pytest.mark.parametrize("replicas,cores", [(3, 2), (1, 3)])
def test_splits_shards_not_power_of_two(replicas, cores):
    with pytest.raises(InvalidArgument, match="ads_table.*must be a power of two"):
        splits_op(num_replica=replicas, num_sc_per_chip=cores, sample_count=12)


def test_splits_single_division_over_the_limits():
    # Vocabulary 64 -> division size 1; col 4 on 3 samples of SC0 is 3 ids in one division.
    rows, cols = [0, 1, 1, 1], [4, 4, 4, 4]  # (1, 4) repeats: 2 ids after dedup
    splits_op(rows=rows, cols=cols, sample_count=8, max_ids_per_partition=2,
              max_unique_ids_per_partition=1)
    rows, cols = [0, 1, 2, 3], [4, 4, 4, 4]
    with pytest.raises(InvalidArgument, match="ads_table' has too many ids for replica 0 on sparse "
                                              "core 0.*max_division_level higher"):
        splits_op(rows=rows, cols=cols, sample_count=8, max_ids_per_partition=3)
    # Vocabulary 384 -> division size 6: cols 1, 3, 5 (replica 1) are 3 unique ids in division 0.
    with pytest.raises(InvalidArgument, match="too many ids for replica 1 on sparse core 1"):
        splits_op(rows=[4, 5, 6], cols=[1, 3, 5], sample_count=8, table_vocab_size=384,
                  max_ids_per_partition=8, max_unique_ids_per_partition=2)


def test_splits_unsorted_rows():
    with pytest.raises(InvalidArgument, match="ads_table.*row_ids must be sorted"):
        splits_op(rows=[0, 2, 1, 3])


def test_splits_row_not_below_sample_count():
    with pytest.raises(InvalidArgument, match=r"row_ids must be sorted and in \[0, 4\)"):
        splits_op(rows=[0, 1, 2, 4])


@pytest.mark.parametrize("col", [-1, 64])
def test_splits_id_out_of_vocabulary(col):
    with pytest.raises(InvalidArgument, match=f"ads_table.*id {col} .*out of range \\[0, 64\\)"):
        splits_op(cols=[1, 5, col, 3])


def test_splits_mismatched_lengths():
    with pytest.raises(InvalidArgument, match=r"row_ids \(4\), col_ids \(3\) and gains \(4\) must "
                                              "have the same length"):
        splits_op(cols=[1, 5, 9], gains=[1.0] * 4)
    with pytest.raises(InvalidArgument, match="same length"):
        splits_op(gains=[1.0])


def test_splits_rank_two_input():
    with pytest.raises(InvalidArgument, match="row_ids must be rank 1"):
        ops.get_minibatch_splits_with_physical_replica(
            ["key"], np.zeros([2, 2], np.int32), np.zeros(4, np.int32), np.ones(4, np.float32),
            sample_count=4, num_replica=1, table_vocab_size=64, feature_width=8,
            num_sc_per_chip=2, table_name="ads_table", mini_batch_splits="")


def test_splits_bad_division_level():
    with pytest.raises(InvalidArgument, match="max_division_level must be in"):
        splits_op(max_division_level=7)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-buffers-with-minibatches minibatches in CSR


def minibatch_csr(rows=None, cols=None, splits=0, id_counts=None, **overrides):
    """S = 2, P = 2, D = 64: one id per (SC, shard) in division 0, unless overridden."""
    S, P, D = 2, 2, 64
    if id_counts is None:
        id_counts = np.zeros(S * P * D + 1, np.int32)
        for g in range(S * P):
            id_counts[g * D + 1:] += 1
    n = int(id_counts[-1])
    args = dict(sample_count=8, num_replica=1, max_minibatches_per_sc=4,
                max_ids_per_chip_per_sample=8, table_vocab_size=64, feature_width=8,
                num_sc_per_chip=2, table_name="ads_table", mini_batch_in_csr="")
    args.update(overrides)
    return ops.get_minibatches_in_csr_with_physical_replica(
        ["key"], np.asarray(rows if rows is not None else np.zeros(n), np.int32),
        np.asarray(cols if cols is not None else np.arange(n), np.int32),
        np.ones(n if rows is None else len(rows), np.float32), np.asarray(splits, np.int64),
        np.asarray(id_counts, np.int32), **args)


def test_minibatch_csr_good_arguments_pass():
    assert int(minibatch_csr().ids_unpadded_size) == 32


def test_minibatch_csr_too_many_minibatches():
    # bits {0, 1, 2} -> splits [16, 32, 48]: 4 minibatches.
    minibatch_csr(splits=7, max_minibatches_per_sc=4, max_ids_per_chip_per_sample=32)
    with pytest.raises(InvalidArgument, match="ads_table.*number of minibatches per sparse core is "
                                              "4, but max_minibatches_per_sc is set to 3 which is "
                                              "smaller"):
        minibatch_csr(splits=[3, 4], max_minibatches_per_sc=3, max_ids_per_chip_per_sample=32)


def test_minibatch_csr_buffer_not_multiple_of_eight():
    with pytest.raises(InvalidArgument, match=r"id buffer size \(12\) must be a non-negative "
                                              "multiple of 8"):
        minibatch_csr(sample_count=4, max_ids_per_chip_per_sample=3)


def test_minibatch_csr_sample_count_not_divisible():
    with pytest.raises(InvalidArgument, match=r"sample_count \(7\) must be divisible by "
                                              r"num_sc_per_chip \(2\)"):
        minibatch_csr(sample_count=7)


def test_minibatch_csr_overflow_without_dropping():
    # MAXC = 2 * 8 = 16 holds two 8-slot segments; there are four.
    with pytest.raises(InvalidArgument, match="ads_table.*does not fit all ids.*allow_id_dropping"):
        minibatch_csr(max_ids_per_chip_per_sample=2)


def test_minibatch_csr_overflow_with_dropping_counts_dropped_ids():
    result = minibatch_csr(max_ids_per_chip_per_sample=2, allow_id_dropping=True)
    assert int(result.num_dropped_ids) == 2
    assert int(result.ids_unpadded_size) == 16
    np.testing.assert_array_equal(result.sorted_token_ids.numpy()[[0, 8]], [0, 1])
    # Partial segment: 10 ids for (SC0, shard 0) into MAXC = 8: 8 kept, 2 + 3 later ones dropped.
    id_counts = np.zeros(2 * 2 * 64 + 1, np.int32)
    id_counts[1:] = 10
    for g in range(1, 4):
        id_counts[g * 64 + 1:] += 1
    result = minibatch_csr(id_counts=id_counts, max_ids_per_chip_per_sample=1,
                           allow_id_dropping=True)
    assert int(result.num_dropped_ids) == 5
    assert int(result.ids_unpadded_size) == 8
    np.testing.assert_array_equal(result.sorted_token_ids.numpy(), range(8))


@pytest.mark.parametrize("size", [1, 129, 258])
def test_minibatch_csr_id_counts_size(size):
    with pytest.raises(InvalidArgument, match=f"id_counts of sparse core 0 has {size} elements, "
                                              "expected 257"):
        minibatch_csr(id_counts=np.zeros(size, np.int32), rows=[], cols=[])


def test_minibatch_csr_id_counts_beyond_data():
    id_counts = np.zeros(257, np.int32)
    id_counts[5:] = 3
    with pytest.raises(InvalidArgument, match="ends at 3 but only 2 ids were given"):
        minibatch_csr(id_counts=id_counts, rows=[0, 0], cols=[0, 1])


def test_minibatch_csr_mismatched_lengths():
    with pytest.raises(InvalidArgument, match="4 row ids, 3 col ids and 4 gains"):
        minibatch_csr(cols=[0, 1, 2])


def test_process_survives_all_of_the_above():
    # A final sanity check that nothing above left the runtime in a bad state.
    rows, cols, gains = (t.numpy() for t in coo(GOOD_SPLITS, [1, 2, 3, 4], 1.0))
    np.testing.assert_array_equal(rows, [0, 2, 2, 3])
