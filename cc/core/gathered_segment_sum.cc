#include "cc/core/gathered_segment_sum.h"

#include <algorithm>
#include <cstring>

#include "cc/core/checked_math.h"
#include "cc/core/range_scan.h"

namespace sce {
namespace {

// Output rows per parallel range, at least; and at most this many ranges.
constexpr int64_t kMinSegmentsPerRange = 256;
constexpr int64_t kMaxRanges = 64;
// Entries whose segment is tested per block before the block's entries in the range are added.
constexpr int64_t kFilterBlock = 2048;
// How many of a block's entries ahead the row read and the output row are prefetched. On
// synthetic exchange-sized inputs (80K entries, 40K rows of 32 floats) 16 takes 5-9% less time
// than no prefetch in both directions, while 8 is slower than none on scattered segments.
constexpr int64_t kPrefetchDistance = 16;

// Where the range bodies below read an entry's row and write an output row: a matrix, or the
// row tables of per-feature tensors (GatheredSegmentSumArgs). kDim > 0 fixes the row width at
// compile time (it must equal a.width; vector_isa.h).
template <int64_t kDim>
struct Rows {
  // Copies of the arguments' pointers: locals the hot loops can keep in registers.
  Rows(const GatheredSegmentSumArgs& a, float* out)
      : rows(a.rows), row_table(a.row_table), out_table(a.out_table), positions(a.positions),
        out(out), width(kDim > 0 ? kDim : a.width) {}

  __attribute__((always_inline)) const float* source(int64_t entry) const {
    return row_table != nullptr ? row_table[positions[entry]]
                                : rows + static_cast<int64_t>(positions[entry]) * width;
  }
  __attribute__((always_inline)) float* output(int64_t segment) const {
    return out_table != nullptr ? out_table[segment] : out + segment * width;
  }
  void Zero(int64_t begin, int64_t end) const {
    if (out_table == nullptr) {
      std::memset(out + begin * width, 0, sizeof(float) * (end - begin) * width);
    } else {
      for (int64_t s = begin; s < end; ++s) std::memset(out_table[s], 0, sizeof(float) * width);
    }
  }

  const float* rows;
  const float* const* row_table;
  float* const* out_table;
  const int32_t* positions;
  float* out;
  int64_t width;
};

// Adds the entries whose segment is in [first, last) into out (rows [first, last) zeroed here),
// in entry order. Entries are filtered a block at a time without a branch (an index is always
// stored, the count advances only for an entry in range): a range then costs one predictable read
// of every segment id, where a branch per entry would mispredict on unsorted segments.
template <int64_t kDim>
__attribute__((always_inline)) inline void SumRangeBody(const GatheredSegmentSumArgs& a,
                                                        int64_t first, int64_t last, float* out) {
  const Rows<kDim> rows(a, out);
  const int64_t width = rows.width;
  rows.Zero(first, last);
  // Segments are validated to [0, num_segments) and num_segments <= kMaxInt32: the unsigned
  // difference is below `span` exactly for the segments in [first, last).
  const uint32_t span = static_cast<uint32_t>(last - first);
  const uint32_t low = static_cast<uint32_t>(first);
  const int64_t lines_per_row = (width * static_cast<int64_t>(sizeof(float)) + 63) / 64;
  int32_t in_range[kFilterBlock];
  for (int64_t base = 0; base < a.num_entries; base += kFilterBlock) {
    const int64_t end = std::min(a.num_entries, base + kFilterBlock);
    int64_t count = 0;
    for (int64_t i = base; i < end; ++i) {
      in_range[count] = static_cast<int32_t>(i);
      count += static_cast<uint32_t>(a.segments[i]) - low < span;
    }
    for (int64_t k = 0; k < count; ++k) {
      if (k + kPrefetchDistance < count) {
        const int64_t ahead = in_range[k + kPrefetchDistance];
        const char* row = reinterpret_cast<const char*>(rows.source(ahead));
        const char* target = reinterpret_cast<const char*>(rows.output(a.segments[ahead]));
        for (int64_t line = 0; line < lines_per_row; ++line) {
          __builtin_prefetch(row + 64 * line);
          __builtin_prefetch(target + 64 * line, 1);
        }
      }
      const int64_t i = in_range[k];
      const float gain = a.gains[i];
      const float* row = rows.source(i);
      float* target = rows.output(a.segments[i]);
      for (int64_t d = 0; d < width; ++d) target[d] += gain * row[d];
    }
  }
}

// SumRangeBody for nondecreasing segments (the forward direction: entries in sample order). The
// range's entries are one run, found by binary search instead of a read of every segment, and
// a row's first entry is stored, not added: as `0.0f + product`, which is what the zero-filled
// row plus that entry gives (a -0.0 product then sums to +0.0, as in TensorFlow), without the
// fill and the read. Only rows without any entry are zeroed.
template <int64_t kDim>
__attribute__((always_inline)) inline void SumSortedRangeBody(const GatheredSegmentSumArgs& a,
                                                              int64_t first, int64_t last,
                                                              float* out) {
  const Rows<kDim> rows(a, out);
  const int64_t width = rows.width;
  const int32_t* segments = a.segments;
  const int64_t begin = std::lower_bound(segments, segments + a.num_entries,
                                         static_cast<int32_t>(first)) - segments;
  const int64_t end = std::lower_bound(segments + begin, segments + a.num_entries,
                                       static_cast<int32_t>(last)) - segments;
  const int64_t lines_per_row = (width * static_cast<int64_t>(sizeof(float)) + 63) / 64;
  int64_t unwritten = first;   // rows [first, unwritten) hold their sum so far
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchDistance < end) {
      const char* row = reinterpret_cast<const char*>(rows.source(i + kPrefetchDistance));
      for (int64_t line = 0; line < lines_per_row; ++line) __builtin_prefetch(row + 64 * line);
    }
    const int64_t segment = segments[i];
    const float gain = a.gains[i];
    const float* row = rows.source(i);
    float* target = rows.output(segment);
    if (segment >= unwritten) {
      rows.Zero(unwritten, segment);
      for (int64_t d = 0; d < width; ++d) target[d] = 0.0f + gain * row[d];
      unwritten = segment + 1;
    } else {
      for (int64_t d = 0; d < width; ++d) target[d] += gain * row[d];
    }
  }
  rows.Zero(unwritten, last);
}

// One out-of-line build of SumRangeBody per instruction set (the same body, compiled for
// `target`); every build adds the same products in the same order, so the results are the same.
#define SCE_DEFINE_SUM_RANGE(name, body, target)                                                 \
  template <int64_t kDim>                                                                       \
  target void name(const GatheredSegmentSumArgs& a, int64_t first, int64_t last, float* out) {  \
    body<kDim>(a, first, last, out);                                                            \
  }
SCE_DEFINE_SUM_RANGE(SumRangeAvx512, SumRangeBody, SCE_TARGET_AVX512)
SCE_DEFINE_SUM_RANGE(SumRangeAvx2, SumRangeBody, SCE_TARGET_AVX2)
SCE_DEFINE_SUM_RANGE(SumRangeBaseline, SumRangeBody, )
SCE_DEFINE_SUM_RANGE(SumSortedRangeAvx512, SumSortedRangeBody, SCE_TARGET_AVX512)
SCE_DEFINE_SUM_RANGE(SumSortedRangeAvx2, SumSortedRangeBody, SCE_TARGET_AVX2)
SCE_DEFINE_SUM_RANGE(SumSortedRangeBaseline, SumSortedRangeBody, )
#undef SCE_DEFINE_SUM_RANGE

using SumRangeFn = void (*)(const GatheredSegmentSumArgs&, int64_t, int64_t, float*);

// The build of SumRange (or, for nondecreasing segments, SumSortedRange) for `isa` and the
// row width.
SumRangeFn SumRangeFor(VectorIsa isa, int64_t width, bool sorted) {
  static constexpr SumRangeFn kBuilds[3][4] = {SCE_ROW_WIDTH_BUILDS(SumRangeBaseline),
                                               SCE_ROW_WIDTH_BUILDS(SumRangeAvx2),
                                               SCE_ROW_WIDTH_BUILDS(SumRangeAvx512)};
  static constexpr SumRangeFn kSortedBuilds[3][4] = {
      SCE_ROW_WIDTH_BUILDS(SumSortedRangeBaseline), SCE_ROW_WIDTH_BUILDS(SumSortedRangeAvx2),
      SCE_ROW_WIDTH_BUILDS(SumSortedRangeAvx512)};
  return SelectRowLoopBuild(sorted ? kSortedBuilds : kBuilds, isa, width);
}

}  // namespace

Status ValidateGatheredSegmentSum(const GatheredSegmentSumArgs& a, const std::string& where) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of rows", a.num_rows, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the row width", a.width, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of entries", a.num_entries, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_segments", a.num_segments, 0, kMaxInt32));
  int64_t output_elements;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the output (num_segments * width)",
                                  {a.num_segments, a.width}, kMaxAllocationElements,
                                  &output_elements));
  if (a.num_entries > 0 && (a.positions == nullptr || a.gains == nullptr ||
                            a.segments == nullptr)) {
    return InvalidArgument(where, ": positions, gains and segment_ids must hold ", a.num_entries,
                           " entries");
  }
  if (a.num_rows > 0 && a.width > 0 && a.rows == nullptr && a.row_table == nullptr) {
    return InvalidArgument(where, ": rows must hold ", a.num_rows, " rows");
  }
  const int64_t bad_position = FirstOutOfRange(a.positions, a.num_entries, a.num_rows);
  if (bad_position >= 0) {
    return InvalidArgument(where, ": positions[", bad_position, "] = ", a.positions[bad_position],
                           " is not a row of rows (", a.num_rows, " rows)");
  }
  const int64_t bad_segment = FirstOutOfRange(a.segments, a.num_entries, a.num_segments);
  if (bad_segment >= 0) {
    return InvalidArgument(where, ": segment_ids[", bad_segment, "] = ",
                           a.segments[bad_segment], " is outside [0, num_segments = ",
                           a.num_segments, ")");
  }
  return Status::Ok();
}

Status CheckFeatureBlocks(int64_t sparse_cores, const std::vector<int64_t>& rows_per_sc,
                          const std::string& where, int64_t* stacked_rows) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "sparse_cores", sparse_cores, 1, kMaxInt32));
  if (rows_per_sc.empty()) return InvalidArgument(where, ": no features");
  int64_t per_sc = 0;
  for (size_t f = 0; f < rows_per_sc.size(); ++f) {
    if (rows_per_sc[f] < 0 || rows_per_sc[f] > kMaxInt32) {
      return InvalidArgument(where, ": feature_rows_per_sc[", f, "] = ", rows_per_sc[f],
                             " is outside [0, ", kMaxInt32, "]");
    }
    per_sc += rows_per_sc[f];   // < 2^31 terms of < 2^31: no overflow before the check below
    SCE_RETURN_IF_ERROR(CheckInRange(where, "the rows per SparseCore", per_sc, 0, kMaxInt32));
  }
  // Within kMaxAllocationElements: the kernels hold one row pointer per stacked row.
  return CheckedSize(where, "the stacked rows (sparse cores * rows per SparseCore)",
                     {sparse_cores, per_sc}, std::min<int64_t>(kMaxInt32, kMaxAllocationElements),
                     stacked_rows);
}

void GatheredSegmentSum(const GatheredSegmentSumArgs& a, float* out,
                        const ParallelFor& parallel_for, int64_t max_ranges, VectorIsa isa) {
  if (a.num_segments == 0 || a.width == 0) return;
  const int64_t ranges = std::clamp<int64_t>(
      a.num_segments / kMinSegmentsPerRange, 1, std::clamp<int64_t>(max_ranges, 1, kMaxRanges));
  const int64_t per_range = (a.num_segments + ranges - 1) / ranges;
  // Cost per range in cycles, roughly: a read of every segment id plus its share of the rows.
  const int64_t cost = a.num_entries + (a.num_entries / ranges + per_range) * a.width;
  // One vectorized pass; it lets sorted segments skip the filter and the zero fill.
  const bool sorted = FirstDecrease(a.segments, a.num_entries) < 0;
  const SumRangeFn sum_range = SumRangeFor(isa, a.width, sorted);
  parallel_for(ranges, cost, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t first = r * per_range;
      const int64_t last = std::min(a.num_segments, first + per_range);
      if (first < last) sum_range(a, first, last, out);
    }
  });
}

}  // namespace sce
