// Helpers shared by the libFuzzer targets in fuzz/: attribute values drawn so that small, valid
// values are common (to get deep into the algorithms) while powers of two up to 2^62, int32 / int64
// extremes and arbitrary 64-bit values still show up (to hit every overflow check), and input
// arrays whose sizes are consistent with the views the TensorFlow kernels build from tensors.
#ifndef SCE_FUZZ_FUZZ_COMMON_H_
#define SCE_FUZZ_FUZZ_COMMON_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace sce_fuzz {

// A value for an integer attribute.
inline int64_t Attr(FuzzedDataProvider& in, int64_t small_max = 16) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0:
      return int64_t{1} << in.ConsumeIntegralInRange<int>(0, 62);
    case 1: {
      static constexpr int64_t kExtremes[] = {
          std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
          std::numeric_limits<int32_t>::max(), int64_t{1} << 31, int64_t{1} << 32,
          (int64_t{1} << 60) + 1, -1, 0};
      return kExtremes[in.ConsumeIntegralInRange<int>(0, 7)];
    }
    case 2:
      return in.ConsumeIntegral<int64_t>();
    default:
      return in.ConsumeIntegralInRange<int64_t>(-1, small_max);
  }
}

// An int32 id / row / pointer: mostly small, sometimes the padding value or an extreme.
inline int32_t Id(FuzzedDataProvider& in, int32_t small_max = 64) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::numeric_limits<int32_t>::max();  // kPad
    case 1:
      return in.ConsumeIntegral<int32_t>();
    case 2:
      return -1;
    default:
      return in.ConsumeIntegralInRange<int32_t>(0, small_max);
  }
}

inline float Value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return in.ConsumeFloatingPoint<float>();
    default:
      return static_cast<float>(in.ConsumeIntegralInRange<int>(-8, 8)) / 4.0f;
  }
}

inline std::vector<int32_t> Ids(FuzzedDataProvider& in, size_t max_size, int32_t small_max = 64) {
  std::vector<int32_t> out(in.ConsumeIntegralInRange<size_t>(0, max_size));
  for (int32_t& v : out) v = Id(in, small_max);
  return out;
}

// Non-decreasing small ints starting at `start` (row ids, row pointers, id counts) with an
// occasional arbitrary value.
inline std::vector<int32_t> Sorted(FuzzedDataProvider& in, size_t size, int32_t start = 0,
                                   int32_t max_step = 3) {
  std::vector<int32_t> out(size);
  int32_t v = start;
  for (int32_t& x : out) {
    if (in.ConsumeIntegralInRange<int>(0, 31) == 0) {
      x = Id(in);
      continue;
    }
    v += in.ConsumeIntegralInRange<int32_t>(0, max_step);
    x = v;
  }
  return out;
}

inline std::vector<float> Values(FuzzedDataProvider& in, size_t size) {
  std::vector<float> out(size);
  for (float& v : out) v = Value(in);
  return out;
}

// A violated invariant of a successful call: report and abort (libFuzzer records the input).
#define SCE_FUZZ_CHECK(cond)                                                        \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

}  // namespace sce_fuzz

#endif  // SCE_FUZZ_FUZZ_COMMON_H_
