"""Host preprocessing: ids -> COO -> (sorted, bucketed) -> CSR-wrapped COO buffers."""
import collections

import tensorflow as tf

from tf_sc_embedding import _core
from tf_sc_embedding._library import library as _lib

# The default of the minibatching ops' max_division_level attribute (cc/core/constants.h).
DEFAULT_MAX_DIVISION_LEVEL = _core.DEFAULT_MAX_DIVISION_LEVEL

_CSR_FIELDS = ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
               "row_pointers_unpadded_size", "ids_unpadded_size")


def _csr_result(name, last_field):
    """A namedtuple with TensorFlow's seven outputs, plus `num_dropped_ids` as an attribute.

    Unpacking yields exactly TensorFlow's outputs, so ported code keeps working; the number of ids
    dropped by `allow_id_dropping` is available without changing the tuple's length.
    """
    base = collections.namedtuple(name, _CSR_FIELDS + (last_field,))

    class Result(base):
        def __new__(cls, *args):
            # Result(op_outputs) from the wrapper (8 outputs), or Result(*fields) when tf.nest
            # rebuilds the tuple (e.g. returned from a tf.function: num_dropped_ids is not a
            # field, so it is None there).
            outputs = args[0] if len(args) == 1 else args
            self = super().__new__(cls, *outputs[:7])
            self.num_dropped_ids = outputs[7] if len(outputs) > 7 else None
            return self

    Result.__name__ = Result.__qualname__ = name
    return Result


CsrWrappedCooTensor = _csr_result("CsrWrappedCooTensor", "num_minibatches_per_sc")
MinibatchesInCsr = _csr_result("MinibatchesInCsr", "num_minibatches_per_physical_sparse_core")


def _check_sparse_cores(num_sc_per_chip, table_name, feature_name=""):
    """InvalidArgumentError for a num_sc_per_chip no op accepts (it sizes output lists)."""
    try:
        value = int(num_sc_per_chip)
    except (TypeError, ValueError):
        return  # a tensor or other type: TensorFlow's attribute checks report it
    if value > _core.MAX_SPARSE_CORES_PER_CHIP:  # values < 1: the attribute check reports them
        where = f"table '{table_name}'" + (f", feature '{feature_name}'" if feature_name else "")
        raise tf.errors.InvalidArgumentError(
            None, None, f"{where}: num_sc_per_chip must be in [1, "
                        f"{_core.MAX_SPARSE_CORES_PER_CHIP}], got {value}")


_INT64 = (-2 ** 63, 2 ** 63 - 1)


def _check_int64_attributes(table_name, **attributes):
    """InvalidArgumentError naming an integer attribute (or list element) outside int64, which
    TensorFlow's attribute conversion would otherwise report as an unrelated SystemError."""
    for name, value in attributes.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(values):
            if isinstance(v, int) and not _INT64[0] <= v <= _INT64[1]:
                where = name if values is not value else f"{name}[{i}]"
                raise tf.errors.InvalidArgumentError(
                    None, None, f"table '{table_name}': attribute {where} = {v} is outside the "
                                "int64 range")


def convert_to_coo_tensor(indices_or_row_splits, values, weights, sample_count, combiner,
                          vocabulary_size=-1, table_name="", feature_name="", name=None):
    """COO entries (row_ids, col_ids, gains) of one feature (docs/preprocessing.md#coo-conversion).

    Unlike TensorFlow's op, ids are validated: an id < 0, or >= `vocabulary_size` when given,
    fails with InvalidArgument naming `table_name` and `feature_name`.
    """
    return _lib.sce_convert_to_coo_tensor(
        indices_or_row_splits=indices_or_row_splits, values=values, weights=weights,
        sample_count=sample_count, combiner=combiner, vocabulary_size=vocabulary_size,
        table_name=table_name, feature_name=feature_name, name=name)


def convert_to_list_of_sparse_core_coo_tensors(
        indices_or_row_splits, values, weights, sample_count, num_sc_per_chip, row_offset,
        col_offset, col_shift, num_sc_shards, stacked_table_sample_count, combiner,
        vocabulary_size=-1, table_name="", feature_name="", name=None):
    """Per-SparseCore COO lists of one feature with the table-stacking transform (docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform).

    The op has 3 * `num_sc_per_chip` outputs, so an impossible `num_sc_per_chip` is rejected here,
    before TensorFlow builds the output list (the kernel and shape function check it as well).
    """
    _check_sparse_cores(num_sc_per_chip, table_name, feature_name)
    return _lib.sce_convert_to_list_of_sparse_core_coo_tensors(
        indices_or_row_splits=indices_or_row_splits, values=values, weights=weights,
        sample_count=sample_count, num_sc_per_chip=num_sc_per_chip, row_offset=row_offset,
        col_offset=col_offset, col_shift=col_shift, num_sc_shards=num_sc_shards,
        stacked_table_sample_count=stacked_table_sample_count, combiner=combiner,
        vocabulary_size=vocabulary_size, table_name=table_name, feature_name=feature_name,
        name=name)


def _stacked_table_arguments(
        table_name, indices_or_row_splits_list, values_list, weights_list, sample_counts,
        row_offsets, col_offsets, col_shifts, vocabulary_sizes, combiners, table_names,
        feature_names, num_sc_per_chip, num_sc_shards, stacked_table_sample_count,
        **more_integers):
    """The keyword arguments shared by the ops that take all features of one stacked table,
    after the checks TensorFlow's attribute conversion cannot make with a useful message (also of
    the integer attributes in `more_integers`)."""
    per_feature = dict(sample_counts=list(sample_counts), row_offsets=list(row_offsets),
                       col_offsets=list(col_offsets), col_shifts=list(col_shifts),
                       vocabulary_sizes=list(vocabulary_sizes))
    _check_sparse_cores(num_sc_per_chip, table_name)
    _check_int64_attributes(table_name, **per_feature, num_sc_shards=num_sc_shards,
                            stacked_table_sample_count=stacked_table_sample_count,
                            **more_integers)
    return dict(indices_or_row_splits=list(indices_or_row_splits_list), values=list(values_list),
                weights=list(weights_list), **per_feature, combiners=list(combiners),
                table_names=list(table_names), feature_names=list(feature_names),
                num_sc_per_chip=num_sc_per_chip, num_sc_shards=num_sc_shards,
                stacked_table_sample_count=stacked_table_sample_count)


def convert_features_to_stacked_coo_tensor(
        indices_or_row_splits_list, values_list, weights_list, sample_counts, row_offsets,
        col_offsets, col_shifts, vocabulary_sizes, combiners, table_names, feature_names,
        num_sc_per_chip, num_sc_shards, stacked_table_sample_count, name=None):
    """(row_ids, col_ids, gains) of all features of one stacked table in one op (not a
    TensorFlow op).

    Equal to running convert_to_list_of_sparse_core_coo_tensors on every feature (per-feature
    arguments as lists, in feature order) and concatenating the lists SparseCore-major: SC 0's
    list of every feature, then SC 1's, and so on. Features convert in parallel in the intra-op
    thread pool. An invalid feature fails with that feature's error (the first in list order).
    """
    return _lib.sce_convert_features_to_stacked_coo_tensor(
        **_stacked_table_arguments(
            table_names[0] if table_names else "", indices_or_row_splits_list, values_list,
            weights_list, sample_counts, row_offsets, col_offsets, col_shifts,
            vocabulary_sizes, combiners, table_names, feature_names, num_sc_per_chip,
            num_sc_shards, stacked_table_sample_count),
        name=name)


def convert_features_to_minibatch_splits(
        indices_or_row_splits_list, values_list, weights_list, sample_counts, row_offsets,
        col_offsets, col_shifts, vocabulary_sizes, combiners, table_names, feature_names,
        num_sc_per_chip, num_sc_shards, stacked_table_sample_count, num_replica,
        table_vocab_size, table_name, max_ids_per_partition=256,
        max_unique_ids_per_partition=256, max_division_level=DEFAULT_MAX_DIVISION_LEVEL,
        name=None):
    """convert_features_to_stacked_coo_tensor followed by
    get_minibatch_splits_with_physical_replica (sample_count = stacked_table_sample_count), in
    one op (not a TensorFlow op; docs/preprocessing.md#one-call-per-stacked-table).

    Gives exactly the outputs of the two ops, without the stacked COO in between. A bad id fails
    with the message naming its table and feature.
    """
    limits = dict(num_replica=num_replica, table_vocab_size=table_vocab_size,
                  max_ids_per_partition=max_ids_per_partition,
                  max_unique_ids_per_partition=max_unique_ids_per_partition)
    return _lib.sce_convert_features_to_minibatch_splits(
        **_stacked_table_arguments(
            table_name, indices_or_row_splits_list, values_list, weights_list, sample_counts,
            row_offsets, col_offsets, col_shifts, vocabulary_sizes, combiners, table_names,
            feature_names, num_sc_per_chip, num_sc_shards, stacked_table_sample_count,
            **limits),
        **limits, table_name=table_name, max_division_level=max_division_level, name=name)


def sort_list_of_sparse_core_coo_tensors(
        row_ids_list, col_ids_list, gains_list, sample_count_list, col_offset_list, num_replica,
        table_vocab_size, feature_width, num_sc_per_chip, max_ids_per_sparse_core,
        max_unique_ids_per_sparse_core, table_name, name=None):
    """Sort, dedup and bucket one source SparseCore's ids by target shard (docs/preprocessing.md#sort-dedup-and-bucket)."""
    return _lib.sce_sort_list_of_sparse_core_coo_tensors(
        row_ids_list=row_ids_list, col_ids_list=col_ids_list, gains_list=gains_list,
        sample_count_list=sample_count_list, col_offset_list=col_offset_list,
        num_replica=num_replica, table_vocab_size=table_vocab_size, feature_width=feature_width,
        num_sc_per_chip=num_sc_per_chip, max_ids_per_sparse_core=max_ids_per_sparse_core,
        max_unique_ids_per_sparse_core=max_unique_ids_per_sparse_core, table_name=table_name,
        name=name)


def get_stats_from_list_of_sparse_core_coo_tensors(
        row_ids_list, col_ids_list, gains_list, sample_count_list, col_offset_list, num_replica,
        table_vocab_size, feature_width, num_sc_per_chip, table_name, name=None):
    """Max ids and max unique ids per target shard for one source SparseCore (docs/preprocessing.md#id-statistics)."""
    return _lib.sce_get_stats_from_list_of_sparse_core_coo_tensors(
        row_ids_list=row_ids_list, col_ids_list=col_ids_list, gains_list=gains_list,
        sample_count_list=sample_count_list, col_offset_list=col_offset_list,
        num_replica=num_replica, table_vocab_size=table_vocab_size, feature_width=feature_width,
        num_sc_per_chip=num_sc_per_chip, table_name=table_name, name=name)


def convert_to_sparse_core_csr_wrapped_coo_tensor(
        sorted_row_ids_list, sorted_col_ids_list, sorted_gains_list, id_counts_list, splits,
        sample_count_per_sc, num_replica, max_minibatches_per_sc, max_ids_per_chip_per_sample,
        table_vocab_size, feature_width, table_name, allow_id_dropping,
        max_division_level=DEFAULT_MAX_DIVISION_LEVEL, trim_to_size=False, name=None):
    """CSR-wrapped COO buffers from per-SparseCore sorted lists (docs/preprocessing.md#csr-wrapped-coo-buffers).

    With `trim_to_size`, the buffers hold exactly the unpadded sizes instead of TensorFlow's static
    capacity (which is still the overflow limit).
    """
    return CsrWrappedCooTensor(_lib.sce_convert_to_sparse_core_csr_wrapped_coo_tensor(
        sorted_row_ids_list=sorted_row_ids_list, sorted_col_ids_list=sorted_col_ids_list,
        sorted_gains_list=sorted_gains_list, id_counts_list=id_counts_list, splits=splits,
        sample_count_per_sc=sample_count_per_sc, num_replica=num_replica,
        max_minibatches_per_sc=max_minibatches_per_sc,
        max_ids_per_chip_per_sample=max_ids_per_chip_per_sample,
        table_vocab_size=table_vocab_size, feature_width=feature_width, table_name=table_name,
        allow_id_dropping=allow_id_dropping, max_division_level=max_division_level,
        trim_to_size=trim_to_size, name=name))


def get_minibatch_splits_with_physical_replica(
        program_key, row_ids, col_ids, gains, sample_count, num_replica, table_vocab_size,
        feature_width, num_sc_per_chip, table_name, mini_batch_splits,
        max_ids_per_partition=256, max_unique_ids_per_partition=256,
        max_division_level=DEFAULT_MAX_DIVISION_LEVEL, name=None):
    """Sort, dedup, bucket and compute the minibatch split bitmask (docs/preprocessing.md#minibatching).

    `max_ids_per_partition` / `max_unique_ids_per_partition` are the per-partition limits that
    TensorFlow reads from the TPU runtime.
    """
    return _lib.sce_get_minibatch_splits_with_physical_replica(
        program_key=program_key, row_ids=row_ids, col_ids=col_ids, gains=gains,
        sample_count=sample_count, num_replica=num_replica, table_vocab_size=table_vocab_size,
        feature_width=feature_width, num_sc_per_chip=num_sc_per_chip, table_name=table_name,
        mini_batch_splits=mini_batch_splits, max_ids_per_partition=max_ids_per_partition,
        max_unique_ids_per_partition=max_unique_ids_per_partition,
        max_division_level=max_division_level, name=name)


def get_minibatches_in_csr_with_physical_replica(
        program_key, row_ids, col_ids, gains, splits, id_counts, sample_count, num_replica,
        max_minibatches_per_sc, max_ids_per_chip_per_sample, table_vocab_size, feature_width,
        num_sc_per_chip, table_name, mini_batch_in_csr, allow_id_dropping=False,
        max_division_level=DEFAULT_MAX_DIVISION_LEVEL, trim_to_size=False, name=None):
    """CSR-wrapped COO buffers, one block per (SparseCore, minibatch) (docs/preprocessing.md#csr-buffers-with-minibatches).

    With `allow_id_dropping`, ids that do not fit are dropped and counted in the result's
    `num_dropped_ids` attribute instead of failing. With `trim_to_size`, the buffers hold exactly
    the unpadded sizes instead of TensorFlow's static capacity (still the overflow limit).
    """
    return MinibatchesInCsr(_lib.sce_get_minibatches_in_csr_with_physical_replica(
        program_key=program_key, row_ids=row_ids, col_ids=col_ids, gains=gains, splits=splits,
        id_counts=id_counts, sample_count=sample_count, num_replica=num_replica,
        max_minibatches_per_sc=max_minibatches_per_sc,
        max_ids_per_chip_per_sample=max_ids_per_chip_per_sample,
        table_vocab_size=table_vocab_size, feature_width=feature_width,
        num_sc_per_chip=num_sc_per_chip, table_name=table_name,
        mini_batch_in_csr=mini_batch_in_csr, allow_id_dropping=allow_id_dropping,
        max_division_level=max_division_level, trim_to_size=trim_to_size, name=name))
