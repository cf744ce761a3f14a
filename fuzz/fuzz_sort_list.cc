// libFuzzer target: sce::SortListOfCoo and sce::CountIdsPerShard (docs/preprocessing.md#sort-dedup-and-bucket, docs/preprocessing.md#id-statistics).
#include <cstdint>
#include <vector>

#include "cc/core/sort_list.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  const int num_features = in.ConsumeIntegralInRange<int>(0, 4);
  std::vector<std::vector<int32_t>> rows(num_features), cols(num_features);
  std::vector<std::vector<float>> gains(num_features);
  std::vector<sce::FeatureCooView> features(num_features);
  for (int f = 0; f < num_features; ++f) {
    cols[f] = sce_fuzz::Ids(in, 48, 256);
    const size_t n = cols[f].size();
    rows[f] = in.ConsumeBool() ? sce_fuzz::Sorted(in, n) : sce_fuzz::Ids(in, 48);
    gains[f] = sce_fuzz::Values(in, in.ConsumeIntegralInRange<int>(0, 7) == 0
                                        ? in.ConsumeIntegralInRange<size_t>(0, 48)
                                        : n);
    sce::FeatureCooView& v = features[f];
    v.rows = rows[f].empty() ? nullptr : rows[f].data();
    v.cols = cols[f].empty() ? nullptr : cols[f].data();
    v.gains = gains[f].empty() ? nullptr : gains[f].data();
    v.num_rows = static_cast<int64_t>(rows[f].size());
    v.num_cols = static_cast<int64_t>(cols[f].size());
    v.num_gains = static_cast<int64_t>(gains[f].size());
    // The kernel reads these attributes as int32 lists.
    v.sample_count = static_cast<int32_t>(Attr(in, 16));
    v.col_offset = static_cast<int32_t>(Attr(in, 64));
  }
  const int64_t num_replica = Attr(in, 4);
  const int64_t num_sc_per_chip = Attr(in, 8);
  if (in.ConsumeBool()) {
    sce::ShardCounts counts;
    if (sce::CountIdsPerShard(features, num_replica, num_sc_per_chip, "t", &counts).ok()) {
      SCE_FUZZ_CHECK(counts.ids.size() == counts.uniques.size());
    }
    return 0;
  }
  const int64_t max_ids = Attr(in, 64), max_uniques = Attr(in, 64);
  sce::SortedCoo out;
  if (sce::SortListOfCoo(features, num_replica, num_sc_per_chip, max_ids, max_uniques, "t", &out)
          .ok()) {
    SCE_FUZZ_CHECK(out.rows.size() == out.cols.size() && out.cols.size() == out.gains.size());
    SCE_FUZZ_CHECK(static_cast<int64_t>(out.id_counts.size()) == num_replica * num_sc_per_chip + 1);
    SCE_FUZZ_CHECK(out.id_counts.back() == static_cast<int32_t>(out.rows.size()));
  }
  return 0;
}
