// libFuzzer target: sce::ValidateCsrView, then (when it accepts) the touched-row marking
// sce::MarkTouchedRows, the lookup
// sce::SparseDenseMatmul (which must overwrite every activation row; its two loops must agree, for
// float32 rows and for bfloat16 rows of 32 columns; the grouping by activation row must pass its
// own validation and the grouped lookup must give the same bits) and the fused update
// sce::FusedUpdate (Adagrad), including the non-finite gradient check, over buffers sized like
// the kernels' input tensors; activations and gradients in the CSR's order, feature-major, or
// (gradients) one buffer per feature, with fuzzed feature sizes that the validation must reject
// when they do not fit.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/core/grouped_entries.h"
#include "cc/core/lookup.h"
#include "cc/core/touched_rows.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  using sce_fuzz::Attr;
  sce::CsrView v;
  v.table_name = "t";
  v.num_sc_per_device = Attr(in, 4);
  v.num_replica = Attr(in, 2);
  v.num_source_replicas = Attr(in, 2);
  v.first_local_shard = in.ConsumeBool() ? 0 : Attr(in, 4);
  v.num_local_shards = in.ConsumeBool() ? -1 : Attr(in, 4);
  v.num_minibatches = static_cast<int32_t>(Attr(in, 3));  // an int32 scalar input
  v.input_size = Attr(in, 16);
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(0, 4);
  const int64_t table_rows = in.ConsumeIntegralInRange<int64_t>(0, 64);
  v.table_rows = table_rows;

  std::vector<int32_t> row_pointers = sce_fuzz::Sorted(
      in, in.ConsumeIntegralInRange<size_t>(0, 80), 0, 9);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 96);
  std::vector<int32_t> samples(n), tokens(n);
  for (size_t i = 0; i < n; ++i) {
    samples[i] = sce_fuzz::Id(in, 8);
    tokens[i] = sce_fuzz::Id(in, 16);
  }
  std::vector<float> gains = sce_fuzz::Values(in, in.ConsumeIntegralInRange<int>(0, 15) == 0
                                                      ? in.ConsumeIntegralInRange<size_t>(0, 96)
                                                      : n);
  v.row_pointers = row_pointers.empty() ? nullptr : row_pointers.data();
  v.num_row_pointers = static_cast<int64_t>(row_pointers.size());
  v.sample_ids = samples.empty() ? nullptr : samples.data();
  v.token_ids = tokens.empty() ? nullptr : tokens.data();
  v.gains = gains.empty() ? nullptr : gains.data();
  v.num_sample_ids = v.num_token_ids = static_cast<int64_t>(n);
  v.num_gains = static_cast<int64_t>(gains.size());
  if (!sce::ValidateCsrView(v).ok()) return 0;

  // The rows a delta would carry (touched_rows.h): exactly the table's own rows are marked, a
  // flag buffer of another size is refused without a write.
  std::vector<uint8_t> flags(static_cast<size_t>(table_rows) + 1, 7);
  SCE_FUZZ_CHECK(!sce::MarkTouchedRows(v, flags.data(), table_rows + 1).ok() &&
                 flags.back() == 7);
  flags.pop_back();
  std::fill(flags.begin(), flags.end(), 0);
  SCE_FUZZ_CHECK(sce::MarkTouchedRows(v, flags.data(), table_rows).ok());

  // The kernels allocate the activations [input_size, dim] only after validation, bounded.
  if (v.input_size > 4096) return 0;
  std::vector<float> table = sce_fuzz::Values(in, static_cast<size_t>(table_rows * dim));
  std::vector<float> accumulator(table.size(), 0.5f);
  std::vector<float> activations(static_cast<size_t>(v.input_size * dim), -1.0f);
  sce::Quantization q;
  if (in.ConsumeBool()) {
    q.low = sce_fuzz::Value(in);
    q.high = sce_fuzz::Value(in);
    q.num_buckets = Attr(in, 8);
    if (!sce::ValidateQuantization(q, "t").ok()) q = sce::Quantization();
  }
  // The activation row order: the CSR's, or feature-major with fuzzed feature sizes.
  sce::FeatureRowsPerSc features;
  if (in.ConsumeBool()) {
    const int count = in.ConsumeIntegralInRange<int>(1, 3);
    for (int f = 0; f < count; ++f) features.push_back(in.ConsumeIntegralInRange<int64_t>(-1, 5));
  }
  if (!sce::ValidateFeatureRows(features, v).ok()) return 0;
  sce::SparseDenseMatmul(v, table.empty() ? static_cast<const float*>(nullptr) : table.data(), dim, q,
                         activations.empty() ? nullptr : activations.data(), sce::RunSerially,
                         features);
  // Every activation row is written (rows without entries become zeros): a zero-filled output
  // buffer gives the same bits as the stale one above, and the loop in buffer order gives the
  // values of the default (sample-major) loop; NaNs count as equal, whatever their payload.
  for (sce::LookupLoop loop : {sce::LookupLoop::kAuto, sce::LookupLoop::kInBufferOrder}) {
    std::vector<float> zeroed(activations.size(), 0.0f);
    sce::SparseDenseMatmul(v, table.empty() ? static_cast<const float*>(nullptr) : table.data(), dim, q,
                           zeroed.empty() ? nullptr : zeroed.data(), sce::RunSerially, features,
                           sce::BestVectorIsa(), loop);
    for (size_t i = 0; i < activations.size(); ++i) {
      SCE_FUZZ_CHECK((std::isnan(zeroed[i]) && std::isnan(activations[i])) ||
                     std::memcmp(&zeroed[i], &activations[i], sizeof(float)) == 0);
    }
  }

  // The grouping by activation row (what one replica's enqueue builds) passes the grouped
  // lookup's validation, and that lookup gives the same bits.
  if (!q.enabled() && sce::CheckGroupable(v).ok()) {
    std::vector<int32_t> row_begin(static_cast<size_t>(v.input_size + 1));
    int64_t total = 0;
    SCE_FUZZ_CHECK(sce::CountEntriesPerActivationRow(v, features, row_begin.data(), &total,
                                                     sce::RunSerially).ok());
    std::vector<int32_t> cursor(row_begin.begin(), row_begin.end() - 1), rows(total);
    std::vector<float> entry_gains(total);
    sce::PlaceEntriesByActivationRow(v, features, cursor.data(), rows.data(), entry_gains.data(),
                                     sce::RunSerially);
    const sce::GroupedEntries grouped{row_begin.data(), static_cast<int64_t>(row_begin.size()),
                                      rows.data(), total, entry_gains.data(), total};
    SCE_FUZZ_CHECK(sce::ValidateGroupedEntries(grouped, table_rows, "t").ok());
    std::vector<float> out(activations.size(), -1.0f);
    sce::SparseDenseMatmulGrouped(grouped, table.empty() ? static_cast<const float*>(nullptr)
                                                         : table.data(),
                                  dim, out.empty() ? nullptr : out.data(), sce::RunSerially);
    for (size_t i = 0; i < out.size(); ++i) {
      SCE_FUZZ_CHECK((std::isnan(out[i]) && std::isnan(activations[i])) ||
                     std::memcmp(&out[i], &activations[i], sizeof(float)) == 0);
    }
  }

  // bfloat16 rows at a width of their hand-written AVX-512 loop (32 columns; the fuzzed float32
  // widths stay below it): both loops give the same bits, whatever the buffers.
  if (!q.enabled() && in.ConsumeBool()) {
    constexpr int64_t kNarrowDim = 32;
    std::vector<sce::Bfloat16> narrow(static_cast<size_t>(table_rows * kNarrowDim));
    for (sce::Bfloat16& value : narrow) value.bits = in.ConsumeIntegral<uint16_t>();
    std::vector<float> by_sample(static_cast<size_t>(v.input_size * kNarrowDim), -1.0f);
    std::vector<float> in_order(by_sample.size(), -1.0f);
    const sce::Bfloat16* rows = narrow.empty() ? nullptr : narrow.data();
    sce::SparseDenseMatmul(v, rows, kNarrowDim, q, by_sample.empty() ? nullptr : by_sample.data(),
                           sce::RunSerially, features, sce::BestVectorIsa(),
                           sce::LookupLoop::kAuto);
    sce::SparseDenseMatmul(v, rows, kNarrowDim, q, in_order.empty() ? nullptr : in_order.data(),
                           sce::RunSerially, features, sce::BestVectorIsa(),
                           sce::LookupLoop::kInBufferOrder);
    for (size_t i = 0; i < by_sample.size(); ++i) {
      SCE_FUZZ_CHECK((std::isnan(by_sample[i]) && std::isnan(in_order[i])) ||
                     std::memcmp(&by_sample[i], &in_order[i], sizeof(float)) == 0);
    }
  }

  std::vector<float> grads = sce_fuzz::Values(in, activations.size());
  const float* g = grads.empty() ? nullptr : grads.data();
  // Gradients: one buffer, or split into one buffer per feature at fuzzed row counts.
  std::vector<const float*> parts = {g};
  if (!features.empty()) {
    std::vector<int64_t> part_rows = {v.input_size};
    if (in.ConsumeBool()) {
      parts.clear();
      part_rows.clear();
      int64_t used = 0;
      for (size_t f = 0; f < features.size(); ++f) {
        const int64_t rows = std::min<int64_t>(
            v.input_size - used, in.ConsumeBool() ? v.num_source_sparse_cores() * features[f]
                                                  : in.ConsumeIntegralInRange<int64_t>(0, 8));
        parts.push_back(g == nullptr ? nullptr : g + used * dim);
        part_rows.push_back(rows);
        used += rows;
      }
      if (used != v.input_size) return 0;  // the kernel's sum of the parts is the input size
    }
    if (!sce::ValidateGradientParts(v, features, part_rows, "grads").ok()) return 0;
  }
  const sce::GradientRows gradient_rows(v, features, parts, dim);
  std::vector<uint8_t> bad;
  const bool skip = in.ConsumeBool();
  if (!sce::AllFinite(g, static_cast<int64_t>(grads.size())) ||
      !sce::AllFinite(v.gains, v.num_gains)) {
    sce::NonFiniteContribution first;
    sce::FindNonFiniteContributions(v, gradient_rows, dim, &bad, &first);
    if (!first.found) bad.clear();
    if (first.found && !skip) return 0;  // the kernel fails the step here
  }
  const std::vector<float> table_before = table;
  const float hypers[1] = {0.0f};
  const int64_t skipped = sce::FusedUpdate<sce::AdagradOptimizer>(
      v, gradient_rows, dim, 0.1f, hypers, sce::Clip(), table.empty() ? nullptr : table.data(),
      std::array<float*, 1>{accumulator.empty() ? nullptr : accumulator.data()},
      sce::RunSerially, bad.empty() ? nullptr : bad.data());
  SCE_FUZZ_CHECK(skipped >= 0);
  if (bad.empty()) SCE_FUZZ_CHECK(skipped == 0);
  // Every row the update changed is a marked row (the delta carries it).
  for (int64_t r = 0; r < table_rows; ++r) {
    for (int64_t c = 0; c < dim; ++c) {
      const size_t at = static_cast<size_t>(r * dim + c);
      if (std::memcmp(&table[at], &table_before[at], sizeof(float)) != 0) {
        SCE_FUZZ_CHECK(flags[static_cast<size_t>(r)] == 1);
      }
    }
  }
  return 0;
}
