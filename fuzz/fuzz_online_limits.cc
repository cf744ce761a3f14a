// libFuzzer target: sce::RaisePartitionLimits (docs/preprocessing.md#online-limits) with
// arbitrary limits, statistics (negative ones included) and table counts.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/online_limits.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int tables = in.ConsumeIntegralInRange<int>(0, 4);
  std::vector<std::string> names;
  for (int t = 0; t < tables; ++t) names.push_back("t" + std::to_string(t));
  const int entries = in.ConsumeIntegralInRange<int>(0, 10);
  std::vector<int32_t> limits, observed;
  for (int i = 0; i < entries; ++i) {
    limits.push_back(in.ConsumeIntegral<int32_t>());
    observed.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 1000)
                                        : in.ConsumeIntegral<int32_t>());
  }
  const std::vector<int32_t> before = limits;
  std::vector<std::string> changes;
  const sce::Status status = sce::RaisePartitionLimits(
      limits.empty() ? nullptr : limits.data(), observed.empty() ? nullptr : observed.data(),
      entries, names, &changes);
  bool negative = false;
  for (int32_t v : observed) negative = negative || v < 0;
  const bool valid = entries == tables * sce::kNumPartitionLimits && !negative;
  SCE_FUZZ_CHECK(status.ok() == valid);
  size_t raised = 0;
  for (int i = 0; i < entries; ++i) {
    if (!status.ok()) {
      SCE_FUZZ_CHECK(limits[i] == before[i]);
    } else {
      SCE_FUZZ_CHECK(limits[i] == (observed[i] > before[i] ? observed[i] : before[i]));
      raised += observed[i] > before[i];
    }
  }
  SCE_FUZZ_CHECK(changes.size() == raised);
  return 0;
}
