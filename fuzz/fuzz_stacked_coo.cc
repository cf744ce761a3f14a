// libFuzzer target: sce::ConvertFeaturesToStackedCoo + sce::WriteStackedCoo and
// sce::GetStackedMinibatchSplits (docs/preprocessing.md), differentially: whenever the stacked
// conversion succeeds, its output must equal every feature's ConvertToListOfCoo lists
// concatenated in SparseCore-major order; and the one-call splits must succeed exactly when the
// stacked conversion followed by GetMinibatchSplits does, with the same outputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/coo.h"
#include "cc/core/minibatch_splits.h"
#include "cc/core/stacked_coo.h"
#include "cc/core/stacked_splits.h"
#include "fuzz/fuzz_common.h"

namespace {

struct FeatureData {
  std::vector<int32_t> splits, values;
  std::vector<float> weights;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  const int num_features = in.ConsumeIntegralInRange<int>(0, 3);
  const int64_t sc = in.ConsumeBool() ? 4 : Attr(in, 4);
  std::vector<FeatureData> storage(num_features);
  std::vector<sce::StackedFeature> features(num_features);
  int64_t offset = 0;
  for (int f = 0; f < num_features; ++f) {
    FeatureData& d = storage[f];
    sce::StackedFeature& feature = features[f];
    const int64_t samples = in.ConsumeBool() ? 4 * in.ConsumeIntegralInRange<int64_t>(1, 4)
                                             : Attr(in, 16);
    d.values = sce_fuzz::Ids(in, 48, 40);
    const size_t n = samples >= 0 && samples < 64 ? static_cast<size_t>(samples + 1) : 2;
    d.splits = sce_fuzz::Sorted(in, n);
    if (!d.splits.empty()) {
      d.splits.front() = 0;
      if (in.ConsumeBool()) d.splits.back() = static_cast<int32_t>(d.values.size());
    }
    d.weights = sce_fuzz::Values(in, in.ConsumeBool() ? d.values.size() : 1);
    feature.input.index_data = d.splits.data();
    feature.input.index_dim0 = static_cast<int64_t>(d.splits.size());
    feature.input.values = d.values.empty() ? nullptr : d.values.data();
    feature.input.num_values = static_cast<int64_t>(d.values.size());
    feature.input.weights = d.weights.data();
    feature.input.weights_rank = d.weights.size() == 1 && d.values.size() != 1 ? 0 : 1;
    feature.input.num_weights = static_cast<int64_t>(d.weights.size());
    feature.sample_count = samples;
    feature.combiner = static_cast<sce::Combiner>(in.ConsumeIntegralInRange<int>(0, 2));
    feature.vocabulary_size = in.ConsumeBool() ? 40 : Attr(in, 64);
    feature.transform.num_sc_per_chip = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? Attr(in, 8) : sc;
    feature.transform.row_offset = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? Attr(in) : offset;
    feature.transform.col_offset = in.ConsumeBool() ? 64 * f : Attr(in, 256);
    feature.transform.col_shift = in.ConsumeBool() ? f : Attr(in, 8);
    feature.transform.num_sc_shards = in.ConsumeBool() ? 8 : Attr(in, 8);
    feature.context = sce::Context{"t", "f" + std::to_string(f)};
    // Saturating: a later feature's offset is only a plausible default, never an overflow.
    constexpr int64_t kCap = int64_t{1} << 40;
    offset = std::min(offset, kCap) + std::min(samples > 0 ? samples : 0, kCap);
  }
  const int64_t stacked = in.ConsumeBool() ? offset : Attr(in, 64);
  for (sce::StackedFeature& f : features) f.transform.stacked_table_sample_count = stacked;

  sce::MinibatchSplitsParams params;
  params.sample_count = stacked;
  params.num_sc_per_chip = features.empty() ? sc : features[0].transform.num_sc_per_chip;
  params.num_replica = in.ConsumeBool() ? 1 : Attr(in, 4);
  params.table_vocab_size = in.ConsumeBool() ? 64 * (num_features + 1) : Attr(in, 512);
  params.max_ids_per_partition = in.ConsumeBool() ? 256 : Attr(in, 16);
  params.max_unique_ids_per_partition = in.ConsumeBool() ? 256 : Attr(in, 16);
  params.max_division_level = in.ConsumeBool() ? 6 : static_cast<int>(Attr(in, 7));
  params.table_name = "stacked";
  sce::MinibatchSplits fused;
  const sce::Status fused_status =
      sce::GetStackedMinibatchSplits(features, params, &fused, sce::RunSerially);

  sce::StackedCooParts parts;
  if (!sce::ConvertFeaturesToStackedCoo(features, sce::RunSerially, &parts).ok()) {
    SCE_FUZZ_CHECK(!fused_status.ok());
    return 0;
  }
  std::vector<int32_t> rows(parts.total), cols(parts.total);
  std::vector<float> gains(parts.total);
  const sce::Status written = sce::WriteStackedCoo(features, parts, rows.data(), cols.data(),
                                                   gains.data(), sce::RunSerially);
  // The one-call splits against the two steps.
  sce::MinibatchSplits two_step;
  const bool two_step_ok =
      written.ok() && params.num_sc_per_chip == parts.num_sc &&
      sce::GetMinibatchSplits(rows.data(), cols.data(), gains.data(), parts.total, parts.total,
                              parts.total, params, &two_step)
          .ok();
  SCE_FUZZ_CHECK(fused_status.ok() == two_step_ok);
  if (two_step_ok) {
    SCE_FUZZ_CHECK(fused.rows == two_step.rows && fused.cols == two_step.cols);
    SCE_FUZZ_CHECK(fused.gains.size() == two_step.gains.size());
    for (size_t i = 0; i < fused.gains.size(); ++i) {
      SCE_FUZZ_CHECK(fused.gains[i] == two_step.gains[i] ||
                     (fused.gains[i] != fused.gains[i] && two_step.gains[i] != two_step.gains[i]));
    }
    SCE_FUZZ_CHECK(fused.id_counts == two_step.id_counts && fused.splits == two_step.splits);
    SCE_FUZZ_CHECK(fused.max_ids == two_step.max_ids &&
                   fused.max_uniques == two_step.max_uniques);
  }
  // The oracle: one ConvertToListOfCoo per feature, concatenated SparseCore-major.
  std::vector<std::vector<sce::CooEntries>> lists(num_features);
  bool all_ok = true;
  for (int f = 0; f < num_features; ++f) {
    const sce::StackedFeature& x = features[f];
    all_ok = all_ok && sce::ConvertToListOfCoo(x.input, x.sample_count, x.combiner, x.transform,
                                               x.vocabulary_size, x.context, &lists[f]).ok();
  }
  SCE_FUZZ_CHECK(written.ok() == all_ok);
  if (!written.ok()) return 0;
  size_t k = 0;
  for (int64_t s = 0; s < parts.num_sc; ++s) {
    for (int f = 0; f < num_features; ++f) {
      const sce::CooEntries& e = lists[f][static_cast<size_t>(s)];
      for (size_t i = 0; i < e.size(); ++i, ++k) {
        SCE_FUZZ_CHECK(k < rows.size());
        SCE_FUZZ_CHECK(rows[k] == e.rows[i] && cols[k] == e.cols[i]);
        SCE_FUZZ_CHECK(gains[k] == e.gains[i] || (gains[k] != gains[k] && e.gains[i] != e.gains[i]));
      }
    }
  }
  SCE_FUZZ_CHECK(k == rows.size());
  return 0;
}
