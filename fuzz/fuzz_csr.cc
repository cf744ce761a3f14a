// libFuzzer target: sce::GetCsrBufferSizes, sce::PackCsrFromSortedLists (docs/preprocessing.md#csr-wrapped-coo-buffers) and
// sce::PackCsrFromMinibatchSplits (docs/preprocessing.md#csr-buffers-with-minibatches), run as the kernels run them: sizes first, then either
// the static buffers (when small enough to allocate) or a dry run plus exact-size buffers.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/csr.h"
#include "fuzz/fuzz_common.h"

namespace {

constexpr int64_t kMaxFuzzBuffer = int64_t{1} << 16;  // what this harness is willing to allocate

struct Buffers {
  std::vector<int32_t> row_pointers, samples, tokens;
  std::vector<float> gains;
  sce::CsrBuffers Bind(int64_t rp, int64_t ids) {
    row_pointers.assign(rp, -7);
    samples.assign(ids, -7);
    tokens.assign(ids, -7);
    gains.assign(ids, -7.0f);
    sce::CsrBuffers b;
    b.row_pointers = row_pointers.data();
    b.sample_ids = ids ? samples.data() : nullptr;
    b.token_ids = ids ? tokens.data() : nullptr;
    b.gains = ids ? gains.data() : nullptr;
    b.row_pointer_buffer_size = rp;
    b.id_buffer_size = ids;
    return b;
  }
};

template <typename Pack>
void Run(FuzzedDataProvider& in, const sce::CsrParams& params, Pack pack) {
  sce::CsrBufferSizes sizes;
  if (!sce::GetCsrBufferSizes(params, &sizes).ok()) return;
  SCE_FUZZ_CHECK(sizes.row_pointers > 0 && sizes.ids >= 0);
  Buffers buffers;
  if (in.ConsumeBool()) {  // trim_to_size: dry run, then exact sizes
    sce::CsrBuffers dry;
    if (!pack(&dry).ok()) return;
    SCE_FUZZ_CHECK(dry.ids_unpadded_size <= sizes.ids);
    SCE_FUZZ_CHECK(dry.row_pointers_unpadded_size <= sizes.row_pointers);
    sce::CsrBuffers out = buffers.Bind(dry.row_pointers_unpadded_size, dry.ids_unpadded_size);
    SCE_FUZZ_CHECK(pack(&out).ok());
    SCE_FUZZ_CHECK(out.num_dropped_ids == dry.num_dropped_ids);
    return;
  }
  if (sizes.row_pointers > kMaxFuzzBuffer || sizes.ids > kMaxFuzzBuffer) return;
  sce::CsrBuffers out = buffers.Bind(sizes.row_pointers, sizes.ids);
  if (pack(&out).ok()) {
    SCE_FUZZ_CHECK(out.ids_unpadded_size <= sizes.ids);
    for (int64_t k = 0; k < out.row_pointers_unpadded_size; ++k) {
      SCE_FUZZ_CHECK(buffers.row_pointers[k] >= 0 && buffers.row_pointers[k] <= sizes.ids);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  sce::CsrParams params;
  params.num_replica = Attr(in, 2);
  params.num_sc_per_chip = Attr(in, 4);
  params.max_minibatches_per_sc = Attr(in, 64);
  params.max_ids_buffer_size = in.ConsumeBool() ? 8 * in.ConsumeIntegralInRange<int64_t>(0, 16)
                                                : Attr(in, 128);
  params.max_division_level = static_cast<int>(Attr(in, 7));
  params.allow_id_dropping = in.ConsumeBool();
  params.table_name = "t";
  const int64_t splits = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 15)
                                          : in.ConsumeIntegral<int64_t>();
  // Id lists sized from small guesses of S and P (the view sizes are what the kernel gets).
  const int64_t S = std::clamp<int64_t>(params.num_sc_per_chip, 0, 8);
  const int64_t P = std::clamp<int64_t>(
      sce::SaturatingMul(std::max<int64_t>(params.num_sc_per_chip, 0),
                         std::max<int64_t>(params.num_replica, 0)),
      1, 16);
  const int64_t D = int64_t{1} << std::clamp(params.max_division_level, 0, 6);
  auto make_view = [&](std::vector<int32_t>* rows, std::vector<int32_t>* cols,
                       std::vector<float>* gains, std::vector<int32_t>* counts,
                       int64_t num_counts) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 40);
    *rows = sce_fuzz::Ids(in, 0);
    rows->resize(n, 0);
    *cols = std::vector<int32_t>(n, 1);
    *gains = std::vector<float>(in.ConsumeIntegralInRange<int>(0, 15) == 0 ? n / 2 : n, 1.0f);
    *counts = sce_fuzz::Sorted(in, static_cast<size_t>(num_counts), 0, 2);
    sce::SortedIdsView v;
    v.rows = rows->data();
    v.cols = cols->data();
    v.gains = gains->data();
    v.num_rows = static_cast<int64_t>(rows->size());
    v.num_cols = static_cast<int64_t>(cols->size());
    v.num_gains = static_cast<int64_t>(gains->size());
    v.id_counts = counts->empty() ? nullptr : counts->data();
    v.num_id_counts = static_cast<int64_t>(counts->size());
    return v;
  };
  if (in.ConsumeBool()) {
    const int64_t num_lists = in.ConsumeBool() ? S : in.ConsumeIntegralInRange<int64_t>(0, 8);
    const bool minibatching = in.ConsumeBool();
    std::vector<std::vector<int32_t>> rows(num_lists), cols(num_lists), counts(num_lists);
    std::vector<std::vector<float>> gains(num_lists);
    std::vector<sce::SortedIdsView> per_sc;
    for (int64_t s = 0; s < num_lists; ++s) {
      // Kernels reject empty id_counts before calling the core.
      const int64_t num_counts = std::max<int64_t>(1, minibatching ? P * D + 1 : P + 1);
      per_sc.push_back(make_view(&rows[s], &cols[s], &gains[s], &counts[s], num_counts));
    }
    Run(in, params, [&](sce::CsrBuffers* out) {
      return sce::PackCsrFromSortedLists(per_sc, splits, params, out);
    });
  } else {
    std::vector<int32_t> rows, cols, counts;
    std::vector<float> gains;
    const sce::SortedIdsView view = make_view(&rows, &cols, &gains, &counts,
                                              in.ConsumeBool() ? S * P * D + 1
                                                               : in.ConsumeIntegralInRange<int>(1, 9));
    Run(in, params, [&](sce::CsrBuffers* out) {
      return sce::PackCsrFromMinibatchSplits(view, splits, params, out);
    });
  }
  return 0;
}
