// libFuzzer target: the two versions of each per-id pass of docs/preprocessing.md#coo-conversion
// (the portable one and, where the CPU has AVX-512, the vectorized one) on arbitrary samples, ids,
// weights (NaN and Inf included) and bounds must agree bit for bit (NaN payloads aside), and stay
// inside their buffers.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cc/core/adjacent_merge.h"
#include "fuzz/fuzz_common.h"

namespace {

struct Result {
  std::vector<int32_t> rows, cols;
  std::vector<uint32_t> gain_bits;
  bool bad = false;
};

template <typename Merge>
Result Run(Merge merge, const std::vector<int32_t>& samples, const std::vector<int32_t>& ids,
           const std::vector<float>& weights, bool per_id, uint32_t bound) {
  const int64_t n = static_cast<int64_t>(ids.size());
  Result r;
  r.rows = samples;
  r.cols.resize(n);
  std::vector<float> gains(n);
  const int64_t count = merge(ids.data(), weights.data(), per_id, n, bound, r.rows.data(),
                              r.cols.data(), gains.data(), &r.bad);
  SCE_FUZZ_CHECK(count >= 0 && count <= n);
  r.rows.resize(count);
  r.cols.resize(count);
  r.gain_bits.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    // Any NaN counts as the same NaN: which operand's payload an addition of two NaNs keeps is
    // up to the compiler's operand order, and no consumer reads a payload (a NaN gain fails the
    // update, or skips its rows).
    const float g = std::isnan(gains[i]) ? std::numeric_limits<float>::quiet_NaN() : gains[i];
    std::memcpy(&r.gain_bits[i], &g, sizeof(float));
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 80);
  const bool per_id = in.ConsumeBool();
  const uint32_t bound = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 80)
                                          : (uint32_t{1} << 31);
  // Samples >= 0 and non-decreasing, as the COO conversion gives them; runs of repeats common.
  std::vector<int32_t> samples(n), ids(n);
  int32_t sample = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool repeat = i > 0 && in.ConsumeIntegralInRange<int>(0, 3) == 0;
    if (!repeat) sample += in.ConsumeIntegralInRange<int32_t>(0, 1);
    samples[i] = repeat ? samples[i - 1] : sample;
    ids[i] = repeat ? ids[i - 1] : sce_fuzz::Id(in, 8);
  }
  std::vector<float> weights(per_id ? n : (n > 0 ? 1 : 0));
  // Mostly sevenths (not exact in binary, so a sum taken in another order gives other bits),
  // sometimes NaN, Inf or an arbitrary float.
  for (float& w : weights) {
    w = in.ConsumeIntegralInRange<int>(0, 7) == 0
            ? sce_fuzz::Value(in)
            : static_cast<float>(in.ConsumeIntegralInRange<int>(-300, 300)) / 7.0f;
  }

  const Result want = Run(&sce::MergeAdjacentDuplicatesBaseline, samples, ids, weights, per_id,
                          bound);
  if (sce::CpuHasAvx512F()) {
    const Result got = Run(&sce::MergeAdjacentDuplicatesAvx512, samples, ids, weights, per_id,
                           bound);
    SCE_FUZZ_CHECK(got.rows == want.rows && got.cols == want.cols &&
                   got.gain_bits == want.gain_bits && got.bad == want.bad);
  }

  std::vector<int32_t> increments(n);
  for (int32_t& x : increments) x = in.ConsumeIntegralInRange<int32_t>(0, 1000);
  std::vector<int32_t> a = increments, b = increments;
  sce::PrefixSumInPlaceBaseline(a.data(), static_cast<int64_t>(n));
  if (sce::CpuHasAvx512F()) {
    sce::PrefixSumInPlaceAvx512(b.data(), static_cast<int64_t>(n));
    SCE_FUZZ_CHECK(a == b);
  }
  return 0;
}
