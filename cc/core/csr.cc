#include "cc/core/csr.h"

#include <algorithm>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/minibatch_splits.h"
#include "cc/core/split_encoding.h"

namespace sce {
namespace {

Status ValidateSortedIds(const SortedIdsView& v, int64_t expected_counts_a,
                         int64_t expected_counts_b, const std::string& table, int64_t sc) {
  if (v.num_rows != v.num_cols || v.num_rows != v.num_gains) {
    return InvalidArgument("table '", table, "': sparse core ", sc, " has ", v.num_rows,
                           " row ids, ", v.num_cols, " col ids and ", v.num_gains,
                           " gains; they must match");
  }
  if (v.num_id_counts != expected_counts_a && v.num_id_counts != expected_counts_b) {
    return InvalidArgument("table '", table, "': id_counts of sparse core ", sc, " has ",
                           v.num_id_counts, " elements, expected ", expected_counts_a,
                           expected_counts_b != expected_counts_a
                               ? " or " + std::to_string(expected_counts_b)
                               : std::string());
  }
  if (v.id_counts[0] < 0) {
    return InvalidArgument("table '", table, "': id_counts must start at a value >= 0");
  }
  for (int64_t i = 1; i < v.num_id_counts; ++i) {
    if (v.id_counts[i] < v.id_counts[i - 1]) {
      return InvalidArgument("table '", table, "': id_counts of sparse core ", sc,
                             " must be non-decreasing; element ", i, " is ", v.id_counts[i],
                             " after ", v.id_counts[i - 1]);
    }
  }
  if (v.id_counts[v.num_id_counts - 1] > v.num_rows) {
    return InvalidArgument("table '", table, "': id_counts of sparse core ", sc, " ends at ",
                           v.id_counts[v.num_id_counts - 1], " but only ", v.num_rows,
                           " ids were given");
  }
  return Status::Ok();
}

// The packing loop shared by docs/preprocessing.md#csr-wrapped-coo-buffers and docs/preprocessing.md#csr-buffers-with-minibatches. `segment(s, p, lo, hi)` returns the [begin, end) range of
// ids of source SC s, target shard p, vocabulary divisions [lo, hi) in view(s).
template <typename ViewOf, typename SegmentOf>
Status Pack(int64_t splits, const CsrParams& params, ViewOf view_of, SegmentOf segment_of,
            CsrBuffers* out) {
  const int64_t S = params.num_sc_per_chip;
  const int64_t P = S * params.num_replica;
  const int64_t D = int64_t{1} << params.max_division_level;
  const int64_t block = RoundUp(P, kXlaPadSize);
  const int64_t capacity = params.max_ids_buffer_size;
  std::vector<int32_t> points = BinaryToBucketSplits(splits, params.max_division_level);
  const int64_t num_minibatches = static_cast<int64_t>(points.size()) + 1;
  if (num_minibatches > params.max_minibatches_per_sc) {
    return InvalidArgument("table '", params.table_name, "': the number of minibatches per sparse core is ",
                           num_minibatches, ", but max_minibatches_per_sc is set to ",
                           params.max_minibatches_per_sc, " which is smaller");
  }
  points.insert(points.begin(), 0);
  points.push_back(static_cast<int32_t>(D));

  const int64_t row_pointer_capacity = params.max_minibatches_per_sc * S * block;
  // Without output buffers this is a dry run that only computes the sizes and drop count. The
  // row-pointer buffer decides: it always has at least one 8-entry block, whereas the id buffers
  // of an exact-size (trimmed) run are empty, with a null data pointer, when there are no ids.
  const bool write = out->row_pointers != nullptr;
  const int64_t id_buffer_size = write ? out->id_buffer_size : capacity;
  const int64_t row_pointer_buffer_size = write ? out->row_pointer_buffer_size : row_pointer_capacity;
  out->num_dropped_ids = 0;
  int64_t g = 0, k = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SortedIdsView& v = view_of(s);
    for (size_t b = 1; b < points.size(); ++b) {
      for (int64_t p = 0; p < P; ++p) {
        int64_t begin, end;
        segment_of(s, p, points[b - 1], points[b], &begin, &end);
        int64_t count = end - begin;
        if (g + count > capacity) {
          if (!params.allow_id_dropping) {
            return InvalidArgument(
                "table '", params.table_name, "': the id buffer holds ", capacity,
                " ids (max_ids_per_chip_per_sample times the per-chip batch), which does not fit "
                "all ids; raise max_ids_per_chip_per_sample or set allow_id_dropping to true");
          }
          out->num_dropped_ids += count - (capacity - g);
          count = capacity - g;
        }
        const int64_t aligned = RoundUp(g + count, kXlaPadSize);
        if (write && (aligned > id_buffer_size || RoundUp(k + 1, kXlaPadSize) > row_pointer_buffer_size)) {
          return InvalidArgument("table '", params.table_name, "': the output buffers (",
                                 row_pointer_buffer_size, " row pointers, ", id_buffer_size,
                                 " ids) are too small for the packed ids");
        }
        if (write) {
          std::copy(v.cols + begin, v.cols + begin + count, out->token_ids + g);
          std::copy(v.rows + begin, v.rows + begin + count, out->sample_ids + g);
          std::copy(v.gains + begin, v.gains + begin + count, out->gains + g);
          out->row_pointers[k] = static_cast<int32_t>(g + count);
          std::fill(out->token_ids + g + count, out->token_ids + aligned, kPad);
          std::fill(out->sample_ids + g + count, out->sample_ids + aligned, kPad);
          std::fill(out->gains + g + count, out->gains + aligned, static_cast<float>(kPad));
        }
        ++k;
        g = aligned;
      }
      const int64_t block_end = RoundUp(k, kXlaPadSize);
      if (write) {
        std::fill(out->row_pointers + k, out->row_pointers + block_end, static_cast<int32_t>(g));
      }
      k = block_end;
    }
  }
  if (write) {
    std::fill(out->row_pointers + k, out->row_pointers + row_pointer_buffer_size, kPad);
    std::fill(out->token_ids + g, out->token_ids + id_buffer_size, kPad);
    std::fill(out->sample_ids + g, out->sample_ids + id_buffer_size, kPad);
    std::fill(out->gains + g, out->gains + id_buffer_size, static_cast<float>(kPad));
  }
  out->ids_unpadded_size = g;
  out->row_pointers_unpadded_size = num_minibatches * S * block;
  out->num_minibatches = num_minibatches;
  return Status::Ok();
}

Status ValidateParams(const CsrParams& params) {
  const std::string& t = params.table_name;
  const std::string where = "table '" + t + "'";
  if (params.num_sc_per_chip < 1 || params.num_replica < 1) {
    return InvalidArgument("table '", t, "': num_sc_per_chip and num_replica must be >= 1");
  }
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "num_sc_per_chip", params.num_sc_per_chip, 1, kMaxSparseCoresPerChip));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_replica", params.num_replica, 1, kMaxReplicas));
  if (params.max_minibatches_per_sc < 1) {
    return InvalidArgument("table '", t, "': max_minibatches_per_sc must be >= 1");
  }
  if (params.max_ids_buffer_size < 0 || params.max_ids_buffer_size % kXlaPadSize != 0) {
    return InvalidArgument("table '", t, "': the id buffer size (", params.max_ids_buffer_size,
                           ") must be a non-negative multiple of ", kXlaPadSize);
  }
  // Positions in the id buffers are int32 row pointers.
  if (params.max_ids_buffer_size > kMaxInt32) {
    return InvalidArgument("table '", t, "': the id buffer size (max_ids_per_chip_per_sample x "
                           "per-chip batch = ", params.max_ids_buffer_size,
                           ") exceeds the int32 position limit of ", kMaxInt32);
  }
  SCE_RETURN_IF_ERROR(CheckDivisionLevel(where, params.max_division_level));
  int64_t row_pointers;
  return CsrRowPointerBufferSize(where, params.num_replica, params.num_sc_per_chip,
                                 params.max_minibatches_per_sc, kMaxInt32, &row_pointers);
}

}  // namespace

Status CsrRowPointerBufferSize(const std::string& where, int64_t num_replica,
                               int64_t num_sc_per_chip, int64_t max_minibatches_per_sc,
                               int64_t max_value, int64_t* size) {
  int64_t num_shards, block;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "num_replica * num_sc_per_chip",
                                  {num_replica, num_sc_per_chip}, kMaxShards, &num_shards));
  if (!CheckedRoundUp(num_shards, kXlaPadSize, &block)) {
    return InvalidArgument(where, ": the shard count overflows");  // unreachable after the bound
  }
  return CheckedSize(where,
                     "the row-pointer buffer size max_minibatches_per_sc * num_sc_per_chip * "
                     "RoundUp(num_replica * num_sc_per_chip, 8)",
                     {max_minibatches_per_sc, num_sc_per_chip, block}, max_value, size);
}

Status WrappedCooIdBufferSize(const std::string& where, int64_t max_ids_per_chip_per_sample,
                              int64_t sample_count_per_sc, int64_t num_sc_per_chip,
                              int64_t max_value, int64_t* size) {
  return CheckedSize(where,
                     "the id buffer size max_ids_per_chip_per_sample * sample_count_per_sc * "
                     "num_sc_per_chip",
                     {max_ids_per_chip_per_sample, sample_count_per_sc, num_sc_per_chip},
                     max_value, size);
}

Status MinibatchCsrIdBufferSize(const std::string& where, int64_t max_ids_per_chip_per_sample,
                                int64_t sample_count, int64_t max_value, int64_t* size) {
  return CheckedSize(where, "the id buffer size max_ids_per_chip_per_sample * sample_count",
                     {max_ids_per_chip_per_sample, sample_count}, max_value, size);
}

Status GetCsrBufferSizes(const CsrParams& params, CsrBufferSizes* sizes) {
  SCE_RETURN_IF_ERROR(ValidateParams(params));
  sizes->ids = params.max_ids_buffer_size;
  return CsrRowPointerBufferSize("table '" + params.table_name + "'", params.num_replica,
                                 params.num_sc_per_chip, params.max_minibatches_per_sc, kMaxInt32,
                                 &sizes->row_pointers);
}

Status PackCsrFromSortedLists(const std::vector<SortedIdsView>& per_sc, int64_t splits,
                              const CsrParams& params, CsrBuffers* out) {
  SCE_RETURN_IF_ERROR(ValidateParams(params));
  const int64_t S = params.num_sc_per_chip;
  const int64_t P = S * params.num_replica;
  const int64_t D = int64_t{1} << params.max_division_level;
  int64_t split_counts;
  SCE_RETURN_IF_ERROR(CheckedSize("table '" + params.table_name + "'",
                                  "id_counts size num_replica * num_sc_per_chip * "
                                  "2^max_division_level",
                                  {P, D}, kMaxIdCounts, &split_counts));
  if (static_cast<int64_t>(per_sc.size()) != S) {
    return InvalidArgument("table '", params.table_name, "': expected one list entry per sparse core (",
                           S, "), got ", per_sc.size());
  }
  for (int64_t s = 0; s < S; ++s) {
    SCE_RETURN_IF_ERROR(ValidateSortedIds(per_sc[s], P + 1, P * D + 1, params.table_name, s));
  }
  const bool minibatching = per_sc[0].num_id_counts == P * D + 1;
  for (int64_t s = 1; s < S; ++s) {
    if ((per_sc[s].num_id_counts == P * D + 1) != minibatching) {
      return InvalidArgument("table '", params.table_name,
                             "': all sparse cores must use the same id_counts layout");
    }
  }
  return Pack(
      splits, params, [&](int64_t s) -> const SortedIdsView& { return per_sc[s]; },
      [&](int64_t s, int64_t p, int64_t lo, int64_t hi, int64_t* begin, int64_t* end) {
        const int32_t* c = per_sc[s].id_counts;
        if (minibatching) {
          *begin = c[p * D + lo];
          *end = c[p * D + hi];
        } else {
          *begin = c[p];
          *end = c[p + 1];
        }
      },
      out);
}

Status PackCsrFromMinibatchSplits(const SortedIdsView& ids, int64_t splits,
                                  const CsrParams& params, CsrBuffers* out) {
  SCE_RETURN_IF_ERROR(ValidateParams(params));
  const int64_t S = params.num_sc_per_chip;
  const int64_t P = S * params.num_replica;
  const int64_t D = int64_t{1} << params.max_division_level;
  int64_t num_id_counts;  // S * P * D + 1, the id_counts GetMinibatchSplits produces
  SCE_RETURN_IF_ERROR(MinibatchIdCountsSize("table '" + params.table_name + "'",
                                            params.num_replica, S, params.max_division_level,
                                            &num_id_counts));
  SCE_RETURN_IF_ERROR(
      ValidateSortedIds(ids, num_id_counts, num_id_counts, params.table_name, 0));
  return Pack(
      splits, params, [&](int64_t) -> const SortedIdsView& { return ids; },
      [&](int64_t s, int64_t p, int64_t lo, int64_t hi, int64_t* begin, int64_t* end) {
        *begin = ids.id_counts[(s * P + p) * D + lo];
        *end = ids.id_counts[(s * P + p) * D + hi];
      },
      out);
}

}  // namespace sce
