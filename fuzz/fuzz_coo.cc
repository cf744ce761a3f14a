// libFuzzer target: sce::ConvertToCoo and sce::ConvertToListOfCoo (docs/preprocessing.md#from-ids-to-coo-entries and docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform) with arbitrary
// attributes and inputs shaped like the tensors the kernels view (dense, ragged, sparse, bad rank).
#include <cstdint>
#include <vector>

#include "cc/core/coo.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  const int form = in.ConsumeIntegralInRange<int>(0, 4);
  const int64_t sample_count = Attr(in);
  std::vector<int32_t> values = sce_fuzz::Ids(in, 64);
  std::vector<int32_t> index;
  sce::IdInput input;
  input.index_rank = 1;
  if (form == 1) {  // ragged row_splits: mostly sample_count + 1 sorted entries
    const size_t n = in.ConsumeBool() && sample_count >= 0 && sample_count < 64
                         ? static_cast<size_t>(sample_count + 1)
                         : in.ConsumeIntegralInRange<size_t>(1, 65);
    index = sce_fuzz::Sorted(in, n);
    input.index_dim0 = static_cast<int64_t>(index.size());
  } else if (form == 2 || form == 3) {  // sparse indices [n, k]
    const int64_t cols = form == 2 ? 2 : in.ConsumeIntegralInRange<int64_t>(0, 3);
    const int64_t rows = in.ConsumeBool() ? static_cast<int64_t>(values.size())
                                          : in.ConsumeIntegralInRange<int64_t>(0, 64);
    std::vector<int32_t> first = sce_fuzz::Sorted(in, rows);
    index.assign(rows * cols, 0);
    for (int64_t r = 0; r < rows && cols > 0; ++r) index[r * cols] = first[r];
    input.index_rank = 2;
    input.index_dim0 = rows;
    input.index_dim1 = cols;
  } else if (form == 4) {  // rank 0 or 3
    input.index_rank = in.ConsumeBool() ? 0 : 3;
    index.assign(input.index_rank == 0 ? 1 : 8, 0);
    input.index_dim0 = input.index_rank == 0 ? 0 : 2;
    input.index_dim1 = 2;
  }
  input.index_data = index.empty() ? nullptr : index.data();
  input.values = values.empty() ? nullptr : values.data();
  input.num_values = static_cast<int64_t>(values.size());
  input.values_rank = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? 2 : 1;
  std::vector<float> weights;
  if (in.ConsumeBool()) {
    input.weights_rank = 0;
    weights = sce_fuzz::Values(in, 1);
  } else {
    input.weights_rank = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? 2 : 1;
    weights = sce_fuzz::Values(in, in.ConsumeBool() ? values.size()
                                                    : in.ConsumeIntegralInRange<size_t>(0, 64));
  }
  input.weights = weights.empty() ? nullptr : weights.data();
  input.num_weights = static_cast<int64_t>(weights.size());
  const sce::Combiner combiner = static_cast<sce::Combiner>(in.ConsumeIntegralInRange<int>(0, 2));
  const int64_t vocabulary_size = Attr(in, 128);
  sce::Context context{"t", "f"};

  if (in.ConsumeBool()) {
    sce::CooEntries out;
    if (sce::ConvertToCoo(input, sample_count, combiner, vocabulary_size, context, &out).ok()) {
      SCE_FUZZ_CHECK(out.rows.size() == out.cols.size() && out.cols.size() == out.gains.size());
      SCE_FUZZ_CHECK(out.size() <= values.size());
      for (size_t i = 0; i < out.size(); ++i) {
        SCE_FUZZ_CHECK(out.rows[i] >= 0 && out.rows[i] < sample_count);
        SCE_FUZZ_CHECK(out.cols[i] >= 0);
      }
    }
    return 0;
  }
  sce::StackingTransform t;
  t.num_sc_per_chip = Attr(in, 8);
  t.row_offset = Attr(in);
  t.col_offset = Attr(in, 1024);
  t.col_shift = Attr(in);
  t.num_sc_shards = Attr(in, 8);
  t.stacked_table_sample_count = Attr(in, 32);
  std::vector<sce::CooEntries> per_sc;
  if (sce::ConvertToListOfCoo(input, sample_count, combiner, t, vocabulary_size, context, &per_sc)
          .ok()) {
    SCE_FUZZ_CHECK(static_cast<int64_t>(per_sc.size()) == t.num_sc_per_chip);
    for (const sce::CooEntries& e : per_sc) {
      for (size_t i = 0; i < e.size(); ++i) {
        SCE_FUZZ_CHECK(e.rows[i] >= 0 && e.rows[i] < t.stacked_table_sample_count);
        SCE_FUZZ_CHECK(e.cols[i] >= t.col_offset);
      }
    }
  }
  return 0;
}
