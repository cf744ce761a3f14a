// libFuzzer target: sce::GetMinibatchSplits (docs/preprocessing.md#minibatching).
#include <cstdint>
#include <vector>

#include "cc/core/minibatch_splits.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  sce::MinibatchSplitsParams params;
  params.sample_count = Attr(in, 16);
  params.num_replica = Attr(in, 4);
  params.num_sc_per_chip = Attr(in, 8);
  params.table_vocab_size = Attr(in, 512);
  params.max_ids_per_partition = Attr(in, 16);
  params.max_unique_ids_per_partition = Attr(in, 16);
  params.max_division_level = static_cast<int>(Attr(in, 7));
  params.table_name = "t";
  std::vector<int32_t> cols = sce_fuzz::Ids(in, 96, 512);
  std::vector<int32_t> rows = sce_fuzz::Sorted(
      in, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegralInRange<size_t>(0, 96)
                                                     : cols.size(),
      0, 1);
  std::vector<float> gains = sce_fuzz::Values(
      in, in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegralInRange<size_t>(0, 96)
                                                     : cols.size());
  sce::MinibatchSplits out;
  if (sce::GetMinibatchSplits(rows.empty() ? nullptr : rows.data(),
                              cols.empty() ? nullptr : cols.data(),
                              gains.empty() ? nullptr : gains.data(),
                              static_cast<int64_t>(rows.size()), static_cast<int64_t>(cols.size()),
                              static_cast<int64_t>(gains.size()), params, &out)
          .ok()) {
    SCE_FUZZ_CHECK(out.rows.size() == out.cols.size() && out.cols.size() == out.gains.size());
    SCE_FUZZ_CHECK(out.id_counts.back() == static_cast<int32_t>(out.rows.size()));
    SCE_FUZZ_CHECK(out.rows.size() <= rows.size());
  }
  return 0;
}
