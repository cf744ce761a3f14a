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
//
// The table is float32, or bfloat16 / float16 (sce::FusedUpdateNarrow). A 16-bit table must come
// out as the float32 reference on the widened rows, each value then rounded alone with the
// element-wise conversions of row_precision.h and the bits of its logical row, which the reference
// derives from the fuzzed member layout by the formula of docs/layout.md; slots as in float32. A
// float16 update whose values leave float16's range must fail with nothing written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/core/optimizers.h"
#include "cc/core/row_precision.h"
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

// The table's element type (float32 is FusedUpdate, the others FusedUpdateNarrow).
enum class RowType { kFloat32, kBfloat16, kFloat16 };

// A 16-bit value of `Row` (the element-wise conversions: the oracle of RoundRow).
uint16_t RoundAlone(float value, uint64_t bits, bool stochastic, bool* overflow, sce::Bfloat16*) {
  return stochastic ? sce::FloatToBfloat16Stochastic(value, bits, overflow)
                    : sce::FloatToBfloat16Nearest(value);
}
uint16_t RoundAlone(float value, uint64_t bits, bool stochastic, bool* overflow, sce::Float16*) {
  return stochastic ? sce::FloatToFloat16Stochastic(value, bits, overflow)
                    : sce::FloatToFloat16Nearest(value, overflow);
}

// The logical row of table row `row` (docs/layout.md): row `token` of shard p holds member m's
// logical row (token - offset_m) * N + ((p - rotation_m) mod N), m the last member with
// offset_m <= token. Written here independently of RowRounding::LogicalRow.
int64_t ReferenceLogicalRow(const sce::RowRounding& layout, const sce::CsrView& view, int64_t row,
                            uint64_t* seed) {
  const int64_t n = view.num_shards(), per_shard = view.rows_per_shard();
  const int64_t shard = view.first_local_shard + row / per_shard, token = row % per_shard;
  size_t m = 0;
  for (size_t k = 0; k < layout.members.size(); ++k) {
    if (layout.members[k].row_offset <= token) m = k;
  }
  *seed = layout.members[m].seed;
  const int64_t residue = ((shard - layout.members[m].rotation) % n + n) % n;
  return (token - layout.members[m].row_offset) * n + residue;
}

// The fused update of a 16-bit table against the float32 reference on its widened rows. The
// member layout and the rounding come from `layout_seed` (taken early from the input, so that
// short inputs vary them too): 1-3 member tables at increasing row offsets inside each shard,
// rotations up to 3N (the kernel reduces them modulo N).
template <typename Optimizer, typename Row>
void CheckNarrowAgainstReference(uint64_t layout_seed, const sce::CsrView& view, int64_t dim,
                                 const float* hypers, const std::vector<float>& grads,
                                 const uint8_t* flags, const sce::Clip& clip, float learning_rate,
                                 sce::VectorIsa isa, const sce::ParallelFor& in_ranges) {
  std::mt19937_64 rng(layout_seed);
  const int64_t per_shard = view.rows_per_shard(), n = view.num_shards();
  sce::RowRounding rounding;
  int64_t offset = 0;
  for (int m = static_cast<int>(rng() % 3) + 1; m > 0 && offset < per_shard; --m) {
    rounding.members.push_back({offset, static_cast<int64_t>(rng() % (3 * n + 1)), rng()});
    offset += 1 + static_cast<int64_t>(rng() % per_shard);
  }
  rounding.num_shards = n;
  rounding.step = static_cast<int64_t>(rng() % (1 << 20));
  rounding.stochastic = rng() % 4 != 0;

  sce_testing::TableAndSlots<Optimizer> kernel(view.table_rows, dim), reference(view.table_rows,
                                                                                dim);
  std::vector<Row> narrow(reference.table.size());
  bool unused = false;
  for (size_t i = 0; i < narrow.size(); ++i) {
    narrow[i].bits = RoundAlone(reference.table[i], 0, false, &unused, &narrow[i]);
    reference.table[i] = sce::RowValue(&narrow[i]);
  }
  const std::vector<Row> before = narrow;
  int64_t overflow_row = -1;
  const int64_t kernel_skipped = sce::FusedUpdateNarrow<Optimizer>(
      view, sce::GradientRows::InCsrOrder(view, grads.data(), dim), dim, learning_rate, hypers,
      clip, narrow.data(), rounding, kernel.slot_pointers, in_ranges, flags, &overflow_row, isa);
  const int64_t reference_skipped = sce_testing::ReferenceFusedUpdate<Optimizer>(
      view, grads.data(), dim, learning_rate, hypers, reference.table.data(),
      std::vector<float*>(reference.slot_pointers.begin(), reference.slot_pointers.end()), flags,
      clip);
  // The reference layout, as the kernel reads it (RowRounding::Member: rotation in [0, N)).
  for (sce::RowRounding::Member& member : rounding.members) member.rotation %= n;
  // Rows the update leaves alone hold 16-bit values, which every rounding keeps.
  bool same = true, overflow = false;
  for (int64_t row = 0; row < view.table_rows; ++row) {
    uint64_t seed;
    const int64_t logical = ReferenceLogicalRow(rounding, view, row, &seed);
    for (int64_t j = 0; j < dim; ++j) {
      const uint64_t bits =
          rounding.stochastic ? sce::ColumnRoundingBits<Row>(seed, logical, j, rounding.step) : 0;
      const uint16_t want = RoundAlone(reference.table[row * dim + j], bits, rounding.stochastic,
                                       &overflow, static_cast<Row*>(nullptr));
      same = same && narrow[row * dim + j].bits == want;
    }
  }
  if (overflow && std::is_same<Row, sce::Float16>::value) {  // nothing written, the row named
    SCE_FUZZ_CHECK(kernel_skipped == -1);
    SCE_FUZZ_CHECK(overflow_row >= 0 && overflow_row < view.table_rows);
    SCE_FUZZ_CHECK(std::memcmp(narrow.data(), before.data(), narrow.size() * sizeof(Row)) == 0);
    sce_testing::TableAndSlots<Optimizer> untouched(view.table_rows, dim);
    for (size_t k = 0; k < kernel.slots.size(); ++k) {
      SCE_FUZZ_CHECK(kernel.slots[k] == untouched.slots[k]);
    }
    return;
  }
  SCE_FUZZ_CHECK(kernel_skipped == reference_skipped);
  SCE_FUZZ_CHECK(same);
  for (size_t k = 0; k < kernel.slots.size(); ++k) {
    SCE_FUZZ_CHECK(std::memcmp(kernel.slots[k].data(), reference.slots[k].data(),
                               kernel.slots[k].size() * sizeof(float)) == 0);
  }
}

// The row type and the 16-bit layout seed, consumed right after the CSR's seed.
struct RowChoice {
  RowType type;
  uint64_t layout_seed;
};

template <typename Optimizer>
void CheckAgainstReference(FuzzedDataProvider& in, const sce_testing::RandomCsr& csr,
                           int64_t dim, const float* hypers, uint32_t seed, RowChoice rows) {
  const RowType row_type = rows.type;
  const sce::CsrView& view = csr.view;
  // 16-bit tables: sometimes gradients large enough to leave float16's range.
  const float scale = row_type != RowType::kFloat32 && rows.layout_seed % 3 == 0 ? 3e4f : 0.5f;
  std::vector<float> grads(static_cast<size_t>(view.input_size * dim));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + seed) * scale;
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
  if (row_type == RowType::kBfloat16) {
    CheckNarrowAgainstReference<Optimizer, sce::Bfloat16>(rows.layout_seed, view, dim, hypers,
                                                          grads, flags, clip, learning_rate, isa,
                                                          in_ranges);
    return;
  }
  if (row_type == RowType::kFloat16) {
    CheckNarrowAgainstReference<Optimizer, sce::Float16>(rows.layout_seed, view, dim, hypers,
                                                         grads, flags, clip, learning_rate, isa,
                                                         in_ranges);
    return;
  }
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
  const RowChoice rows{static_cast<RowType>(in.ConsumeIntegralInRange<int>(0, 2)),
                       in.ConsumeIntegral<uint64_t>()};
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
      CheckAgainstReference<sce::SgdOptimizer>(in, csr, dim, none, seed, rows);
      break;
    }
    case 1: {
      const float none[1] = {0.0f};
      CheckAgainstReference<sce::AdagradOptimizer>(in, csr, dim, none, seed, rows);
      break;
    }
    case 2: {
      const float hypers[5] = {flag ? 1.0f : 0.0f, 2.0f, 0.9f, flag ? 1.0f : 0.99f, 1e-5f};
      CheckAgainstReference<sce::AdagradMomentumOptimizer>(in, csr, dim, hypers, seed, rows);
      break;
    }
    case 3: {
      const float hypers[4] = {flag ? 1.0f : 0.0f, 0.9f, 0.999f, 1e-3f};
      CheckAgainstReference<sce::AdamOptimizer>(in, csr, dim, hypers, seed, rows);
      break;
    }
    case 4: {
      // The embedding is all columns, or (flag) only the first half (the rest is padding).
      const float hypers[2] = {1e-8f, static_cast<float>(flag ? (dim + 1) / 2 : dim)};
      if (dim > 0) {
        CheckAgainstReference<sce::RowWiseAdagradOptimizer>(in, csr, dim, hypers, seed, rows);
      }
      break;
    }
    default: {
      const float hypers[5] = {flag ? 1.0f : 0.0f, 0.1f, 0.5f, 0.01f, 0.02f};
      CheckAgainstReference<sce::FtrlOptimizer>(in, csr, dim, hypers, seed, rows);
      break;
    }
  }
  return 0;
}
