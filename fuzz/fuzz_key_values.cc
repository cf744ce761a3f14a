// libFuzzer target: sce::KeyedRandomRows and sce::InverseNormal (cc/core/key_values.h) with
// arbitrary seeds, keys, widths, distributions and parameters. Every value must be finite for
// finite parameters, within [low, high] for uniform rows and within two standard deviations for
// truncated normal ones, and a row must be the same drawn alone or among others.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cc/core/key_values.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint64_t seed = in.ConsumeIntegral<uint64_t>();
  const int64_t width = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const auto distribution =
      static_cast<sce::KeyedDistribution>(in.ConsumeIntegralInRange<int>(0, 2));
  const double a = in.ConsumeFloatingPointInRange<float>(-1e3f, 1e3f);
  const double b = in.ConsumeFloatingPointInRange<float>(0.0f, 1e3f);
  std::vector<uint64_t> keys;
  while (keys.size() < 64 && in.remaining_bytes() >= sizeof(uint64_t)) {
    keys.push_back(in.ConsumeIntegral<uint64_t>());
  }
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> rows(n * width), one(width);
  sce::KeyedRandomRows(seed, keys.data(), n, width, distribution, a, b, rows.data());
  for (int64_t i = 0; i < n; ++i) {
    sce::KeyedRandomRows(seed, &keys[i], 1, width, distribution, a, b, one.data());
    for (int64_t j = 0; j < width; ++j) {
      const float v = rows[i * width + j];
      SCE_FUZZ_CHECK(v == one[j]);
      SCE_FUZZ_CHECK(std::isfinite(v));
      const double u = sce::KeyedUniform(seed, keys[i], j);
      SCE_FUZZ_CHECK(u > 0.0 && u < 1.0);
      const double tolerance = 1e-5 * (1.0 + std::fabs(a) + b);
      if (distribution == sce::KeyedDistribution::kUniform) {
        SCE_FUZZ_CHECK(v >= std::fmin(a, b) - tolerance && v <= std::fmax(a, b) + tolerance);
      } else if (distribution == sce::KeyedDistribution::kTruncatedNormal) {
        SCE_FUZZ_CHECK(std::fabs(v - a) <= 2.0 * b + tolerance);
      }
    }
  }
  const double p = in.ConsumeProbability<double>();
  if (p > 0.0 && p < 1.0) {
    const double x = sce::InverseNormal(p);
    SCE_FUZZ_CHECK(std::isfinite(x));
    SCE_FUZZ_CHECK(std::fabs(0.5 * std::erfc(-x / std::sqrt(2.0)) - p) <= 1e-12 + 1e-9 * p);
  }
  return 0;
}
