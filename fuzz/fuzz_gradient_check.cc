// libFuzzer target: sce::RequireFiniteFeatureGradients (docs/optimizers.md#non-finite-gradients)
// with arbitrary flags and name lists of any (possibly inconsistent) lengths.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/gradient_check.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int num_flags = in.ConsumeIntegralInRange<int>(0, 8);
  std::vector<int32_t> flags;
  for (int i = 0; i < num_flags; ++i) flags.push_back(in.ConsumeIntegral<int32_t>());
  std::vector<std::string> features, tables;
  const int num_features = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < num_features; ++i) features.push_back(in.ConsumeRandomLengthString(8));
  const int num_tables = in.ConsumeBool() ? num_features : in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < num_tables; ++i) tables.push_back(in.ConsumeRandomLengthString(8));
  const int64_t claimed = in.ConsumeBool() ? num_flags : sce_fuzz::Attr(in, 8);
  const int64_t n = claimed <= num_flags ? claimed : num_flags;   // never read past `flags`
  const sce::Status status = sce::RequireFiniteFeatureGradients(
      flags.empty() ? nullptr : flags.data(), n, features, tables);
  bool any = false;
  for (int64_t i = 0; i < n && i < num_flags; ++i) any = any || flags[i] != 0;
  const bool consistent = n >= 0 && static_cast<size_t>(n) == features.size() &&
                          features.size() == tables.size();
  SCE_FUZZ_CHECK(status.ok() == (consistent && !any));
  return 0;
}
