// libFuzzer target: sce::ValidateGatheredSegmentSum + sce::GatheredSegmentSum
// (cc/core/gathered_segment_sum.h) with arbitrary sizes, indices and values, the sizes claimed
// as the TensorFlow kernel passes them (buffers always hold what is claimed). Whatever is
// accepted must run without reading or writing out of bounds (ASan) and give the entry-order sum.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/core/gathered_segment_sum.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t num_rows = in.ConsumeIntegralInRange<int64_t>(0, 16);
  const int64_t width = in.ConsumeIntegralInRange<int64_t>(0, 40);
  std::vector<float> rows = sce_fuzz::Values(in, num_rows * width);
  std::vector<int32_t> positions = sce_fuzz::Ids(in, 64, 20);
  const size_t n = positions.size();
  std::vector<int32_t> segments(n);
  for (int32_t& s : segments) s = sce_fuzz::Id(in, 600);
  std::vector<float> gains = sce_fuzz::Values(in, n);
  // Mostly a small segment count, sometimes an extreme one (the size checks must catch it).
  const int64_t num_segments = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 700)
                                                : sce_fuzz::Attr(in, 700);
  sce::GatheredSegmentSumArgs args{rows.data(), num_rows, width, positions.data(), gains.data(),
                                   segments.data(), static_cast<int64_t>(n), num_segments};
  const int64_t max_ranges = in.ConsumeIntegralInRange<int64_t>(0, 9);  // any split into ranges
  if (!sce::ValidateGatheredSegmentSum(args, "fuzz").ok()) return 0;
  SCE_FUZZ_CHECK(num_segments >= 0 && num_segments * width <= (int64_t{1} << 28));
  // Accepted outputs of up to 1 GiB are fine for the op; filling them here only slows fuzzing
  // (and two of them would approach libFuzzer's memory limit).
  if (num_segments * width > (int64_t{1} << 16)) return 0;
  std::vector<float> out(num_segments * width, 1.0f);
  sce::GatheredSegmentSum(args, out.data(), sce::RunSerially, max_ranges);
  std::vector<float> expected(num_segments * width, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    SCE_FUZZ_CHECK(positions[i] >= 0 && positions[i] < num_rows);
    SCE_FUZZ_CHECK(segments[i] >= 0 && segments[i] < num_segments);
    for (int64_t d = 0; d < width; ++d) {
      const float product = gains[i] * rows[positions[i] * width + d];
      expected[segments[i] * width + d] += product;
    }
  }
  // Bit for bit, except that any NaN matches any NaN (which operand's payload an add keeps may
  // differ between the vectorized and the scalar loop).
  for (size_t i = 0; i < out.size(); ++i) {
    SCE_FUZZ_CHECK((std::isnan(out[i]) && std::isnan(expected[i])) ||
                   std::memcmp(&out[i], &expected[i], sizeof(float)) == 0);
  }
  return 0;
}
