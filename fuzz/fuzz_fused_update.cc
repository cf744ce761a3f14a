// libFuzzer target: sce::FusedUpdate against the stable-sort reference of
// cc/tests/fused_update_reference.h, bit for bit (table, every slot, and the skipped-row count).
//
// fuzz_csr_view.cc feeds the update hostile buffers and checks that nothing is read or written out
// of bounds; this target checks the numbers. The update merges sorted runs block by block, cuts a
// row whose contributions overflow a block's list and carries its partial sum into the next block
// (docs/optimizers.md, "How the kernel visits the rows"), and falls back to collecting and sorting
// when the runs are unsorted or too many. None of that may change a bit. The CSR is generated from
// a fuzzed seed and shape (sce_testing::RandomCsr), so a short input can describe a shard with
// thousands of contributions to one row, which is what reaches the cuts. Also fuzzed: the row
// width (the compile-time widths and runtime ones, up to wider than a whole block), the optimizer
// and its hyperparameters, clipping, the instruction set, flagged activation rows, and how the
// shards are split into parallel ranges.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/core/optimizers.h"
#include "cc/tests/fused_update_reference.h"
#include "fuzz/fuzz_common.h"

namespace {

// Bounds on one input's work, so that an execution takes milliseconds under the sanitizers.
constexpr int64_t kMaxContributions = 40000;        // entries the generator may write
constexpr int64_t kMaxContributionFloats = 1 << 21;  // entries x width
constexpr int64_t kMaxRowFloats = 1 << 22;           // table rows, or activation rows, x width

int64_t FuzzedWidth(FuzzedDataProvider& in, int64_t max_entries) {
  const int64_t block_floats = sce::kRowSumBlockBytes / static_cast<int64_t>(sizeof(float));
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: {  // the widths with compile-time versions
      static constexpr int64_t kWidths[] = {8, 16, 32, 64, 128};
      return kWidths[in.ConsumeIntegralInRange<int>(0, 4)];
    }
    case 1:  // one row per block, or a block's width exactly
      return max_entries <= 16 ? block_floats + in.ConsumeIntegralInRange<int64_t>(-1, 1) : 4;
    default:
      return in.ConsumeIntegralInRange<int64_t>(1, 72);
  }
}

template <typename Optimizer>
void CheckAgainstReference(FuzzedDataProvider& in, const sce_testing::RandomCsr& csr,
                           int64_t dim, const float* hypers, uint32_t seed) {
  const sce::CsrView& view = csr.view;
  std::vector<float> grads(static_cast<size_t>(view.input_size * dim));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + seed) * 0.5f;
  std::vector<uint8_t> bad;
  if (in.ConsumeBool()) {
    bad.assign(static_cast<size_t>(view.input_size), 0);
    const size_t stride = in.ConsumeIntegralInRange<size_t>(1, 1000);
    for (size_t r = in.ConsumeIntegralInRange<size_t>(0, stride - 1); r < bad.size(); r += stride) {
      bad[r] = 1;
    }
  }
  sce::Clip clip;
  if (in.ConsumeBool()) {
    clip.min = -in.ConsumeIntegralInRange<int>(0, 8) / 8.0f;
    clip.max = in.ConsumeIntegralInRange<int>(0, 8) / 8.0f;
  }
  const float learning_rate = in.ConsumeIntegralInRange<int>(1, 64) / 64.0f;
  std::vector<sce::VectorIsa> isas = {sce::VectorIsa::kBaseline};
  if (sce::BestVectorIsa() != sce::VectorIsa::kBaseline) isas.push_back(sce::VectorIsa::kAvx2);
  if (sce::BestVectorIsa() == sce::VectorIsa::kAvx512) isas.push_back(sce::VectorIsa::kAvx512);
  const sce::VectorIsa isa = isas[in.ConsumeIntegralInRange<size_t>(0, isas.size() - 1)];
  // The shards in parallel ranges of a fuzzed size, run last range first: each range must update
  // its own shards only, whatever ran before it on the same thread.
  const int64_t range = in.ConsumeIntegralInRange<int64_t>(1, 4);
  const sce::ParallelFor in_ranges = [range](int64_t n, int64_t, const sce::RangeFn& work) {
    for (int64_t end = n; end > 0; end -= std::min(end, range)) {
      work(std::max<int64_t>(0, end - range), end);
    }
  };

  const uint8_t* flags = bad.empty() ? nullptr : bad.data();
  sce_testing::TableAndSlots<Optimizer> kernel(view.table_rows, dim), reference(view.table_rows,
                                                                                dim);
  const int64_t kernel_skipped = sce::FusedUpdate<Optimizer>(
      view, sce::GradientRows::InCsrOrder(view, grads.data(), dim), dim, learning_rate, hypers,
      clip, kernel.table.data(), kernel.slot_pointers, in_ranges, flags, isa);
  const int64_t reference_skipped = sce_testing::ReferenceFusedUpdate<Optimizer>(
      view, grads.data(), dim, learning_rate, hypers, reference.table.data(),
      std::vector<float*>(reference.slot_pointers.begin(), reference.slot_pointers.end()), flags,
      clip);
  SCE_FUZZ_CHECK(kernel_skipped == reference_skipped);
  SCE_FUZZ_CHECK(kernel.SameBits(reference));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint32_t seed = in.ConsumeIntegral<uint32_t>();
  const int64_t G = in.ConsumeIntegralInRange<int64_t>(1, 3);         // source replicas
  const int64_t S = int64_t{1} << in.ConsumeIntegralInRange<int>(0, 2);  // SparseCores = shards
  const int64_t M = in.ConsumeIntegralInRange<int64_t>(1, 4);         // minibatches
  const int64_t R = in.ConsumeIntegralInRange<int64_t>(1, 3000);      // rows per shard
  const int64_t samples = in.ConsumeIntegralInRange<int64_t>(1, 2000);  // per SparseCore
  const bool sorted = in.ConsumeIntegralInRange<int>(0, 7) != 0;      // unsorted: the fallback
  const uint32_t max_entries = in.ConsumeIntegralInRange<uint32_t>(0, 2000);  // per segment
  const int64_t segments = G * S * M * S;
  if (segments * max_entries > kMaxContributions) return 0;
  const int64_t dim = FuzzedWidth(in, max_entries);
  if (segments * std::max<int64_t>(max_entries, 1) * dim > kMaxContributionFloats ||
      S * R * dim > kMaxRowFloats || G * S * samples * dim > kMaxRowFloats) {
    return 0;
  }

  const sce_testing::RandomCsr csr(seed, G, S, M, R, samples, sorted, max_entries);
  SCE_FUZZ_CHECK(sce::ValidateCsrView(csr.view).ok());
  const bool flag = in.ConsumeBool();
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: {
      const float none[1] = {0.0f};
      CheckAgainstReference<sce::SgdOptimizer>(in, csr, dim, none, seed);
      break;
    }
    case 1: {
      const float none[1] = {0.0f};
      CheckAgainstReference<sce::AdagradOptimizer>(in, csr, dim, none, seed);
      break;
    }
    case 2: {
      const float hypers[5] = {flag ? 1.0f : 0.0f, 2.0f, 0.9f, flag ? 1.0f : 0.99f, 1e-5f};
      CheckAgainstReference<sce::AdagradMomentumOptimizer>(in, csr, dim, hypers, seed);
      break;
    }
    case 3: {
      const float hypers[4] = {flag ? 1.0f : 0.0f, 0.9f, 0.999f, 1e-3f};
      CheckAgainstReference<sce::AdamOptimizer>(in, csr, dim, hypers, seed);
      break;
    }
    case 4: {
      // The embedding is all columns, or (flag) only the first half (the rest is padding).
      const float hypers[2] = {1e-8f, static_cast<float>(flag ? (dim + 1) / 2 : dim)};
      if (dim > 0) CheckAgainstReference<sce::RowWiseAdagradOptimizer>(in, csr, dim, hypers, seed);
      break;
    }
    default: {
      const float hypers[5] = {flag ? 1.0f : 0.0f, 0.1f, 0.5f, 0.01f, 0.02f};
      CheckAgainstReference<sce::FtrlOptimizer>(in, csr, dim, hypers, seed);
      break;
    }
  }
  return 0;
}
