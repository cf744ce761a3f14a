#include "cc/core/gathered_segment_sum.h"

#include <algorithm>
#include <cstring>

#include "cc/core/checked_math.h"

namespace sce {
namespace {

// Output rows per parallel range, at least; and at most this many ranges (each range reads all
// segment ids once, so more ranges than threads only add reads).
constexpr int64_t kMinSegmentsPerRange = 256;
constexpr int64_t kMaxRanges = 8;

// Index of the first entry of `values[0, n)` outside [0, limit), or -1.
int64_t FirstOutOfRange(const int32_t* values, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] < 0 || values[i] >= limit) return i;
  }
  return -1;
}

// Adds the entries whose segment is in [first, last) into out (rows [first, last) zeroed here).
__attribute__((target_clones("avx512f", "avx2", "default"))) void SumRange(
    const GatheredSegmentSumArgs& a, int64_t first, int64_t last, float* out) {
  const int64_t width = a.width;
  std::memset(out + first * width, 0, sizeof(float) * (last - first) * width);
  for (int64_t i = 0; i < a.num_entries; ++i) {
    const int64_t segment = a.segments[i];
    if (segment < first || segment >= last) continue;
    const float gain = a.gains[i];
    const float* row = a.rows + static_cast<int64_t>(a.positions[i]) * width;
    float* target = out + segment * width;
    for (int64_t d = 0; d < width; ++d) target[d] += gain * row[d];
  }
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
  if (a.num_rows > 0 && a.width > 0 && a.rows == nullptr) {
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

void GatheredSegmentSum(const GatheredSegmentSumArgs& a, float* out,
                        const ParallelFor& parallel_for) {
  if (a.num_segments == 0 || a.width == 0) return;
  const int64_t ranges =
      std::clamp<int64_t>(a.num_segments / kMinSegmentsPerRange, 1, kMaxRanges);
  const int64_t per_range = (a.num_segments + ranges - 1) / ranges;
  // Cost per range in cycles, roughly: a read of every segment id plus its share of the rows.
  const int64_t cost = a.num_entries + (a.num_entries / ranges + per_range) * a.width;
  parallel_for(ranges, cost, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t first = r * per_range;
      const int64_t last = std::min(a.num_segments, first + per_range);
      if (first < last) SumRange(a, first, last, out);
    }
  });
}

}  // namespace sce
