// The backward pass with a fused optimizer (docs/optimizers.md#gradient-accumulation): gradients of every entry that references
// a table row are summed first (across samples, SparseCores, minibatches and features), then the
// optimizer updates that row once, in place. Rows that are not referenced are never touched, so the
// cost of a step depends on the batch, not on the vocabulary size.
#ifndef SCE_CORE_FUSED_UPDATE_H_
#define SCE_CORE_FUSED_UPDATE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/csr_view.h"
#include "cc/core/optimizers.h"
#include "cc/core/parallel.h"

namespace sce {

// One gradient contribution to a row of a shard.
struct RowContribution {
  int32_t token;        // row inside the shard
  int32_t activation;   // row of the activation gradient
  float gain;
};

// sum[0:dim] += gain * g[0:dim]. Always inlined, so it is vectorized for the ISA of the update
// loop it is inlined into (see UpdateShards).
__attribute__((always_inline)) inline void AccumulateScaled(float* sum, const float* g, float gain,
                                                            int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) sum[j] += gain * g[j];
}

// True when the CPU runs the AVX-512 (F, VL, BW, DQ) versions of the hot loops; checked once.
bool CpuHasAvx512();

// All contributions to shard p (a global shard index), sorted by token (stable, so the summation
// order is fixed: source SparseCore, minibatch, position).
void CollectShardContributions(const CsrView& view, int64_t p, std::vector<RowContribution>* out);

// What the fused update does with non-finite (NaN or +-Inf) gradient contributions: fail the step
// before anything is written (the default), or skip the table rows they would touch and count them.
enum class NonFiniteGradients { kError, kSkip };
Status ParseNonFiniteGradients(const std::string& name, NonFiniteGradients* mode);

// True when no value of x[0:n] is NaN or +-Inf. One vectorizable pass (bit test on the exponent),
// multiversioned for AVX2.
bool AllFinite(const float* x, int64_t n);

// The first contribution (in shard, source SparseCore, minibatch, position order) of the local
// shards whose activation gradient row or gain is not finite.
struct NonFiniteContribution {
  bool found = false;
  int64_t shard = 0;           // global shard index
  int64_t token = 0;           // row inside the shard
  int64_t table_row = 0;       // row of the (local) table
  int64_t activation_row = 0;  // row of activation_gradients
  int64_t position = 0;        // position in the id buffers
  float gain = 0.0f;
  bool bad_gain = false;
};

// Marks the activation rows holding a non-finite value (one flag per row of grads) and finds the
// first referenced non-finite contribution. Only called when AllFinite failed on the gradients or
// the gains, so it is off the hot path. `view` must have passed ValidateCsrView.
void FindNonFiniteContributions(const CsrView& view, const float* grads, int64_t dim,
                                std::vector<uint8_t>* bad_activation_rows,
                                NonFiniteContribution* first);

// Prefetches the cache lines of `bytes` bytes at p (a row of a table, slot or gradient buffer).
__attribute__((always_inline)) inline void PrefetchRow(const float* p, int64_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(c + line);
}

// How far ahead (in contributions) the update loop prefetches gradient rows and table / slot
// rows: far enough to hide a memory access behind the work of the entries in between.
constexpr size_t kGradientPrefetchDistance = 12;
constexpr size_t kRowPrefetchDistance = 24;

// The update of local shards [p_begin, p_end): one shard at a time, rows in token order, each
// row's contributions summed, then one optimizer step per row. Always inlined into one function
// per instruction set (UpdateShardsAvx512 / UpdateShardsBaseline), so the accumulation and the
// optimizer's per-row math are vectorized as widely as the CPU allows; the arithmetic is the
// same element-wise operations in the same order (no FMA contraction: -ffp-contract=off), so
// both versions give bit-identical results.
template <typename Optimizer, bool kSkipNonFinite>
__attribute__((always_inline)) inline int64_t UpdateShards(
    const CsrView& view, const float* grads, int64_t dim, float learning_rate, const float* hypers,
    const Clip& clip, float* table, const std::array<float*, Optimizer::kSlots.size()>& slots,
    const uint8_t* bad_activation_rows, int64_t p_begin, int64_t p_end) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t rows_per_shard = view.rows_per_shard();
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(float));
  thread_local std::vector<RowContribution> entries;
  thread_local std::vector<float> sum;
  sum.resize(dim);
  float* slot_rows[kNumSlots + 1];
  int64_t skipped = 0;
  for (int64_t p = p_begin; p < p_end; ++p) {
    CollectShardContributions(view, view.first_local_shard + p, &entries);
    const size_t n = entries.size();
    const int64_t shard_row = p * rows_per_shard;
    for (size_t i = 0; i < n;) {
      const int32_t token = entries[i].token;
      std::fill(sum.begin(), sum.end(), 0.0f);
      bool skip = false;
      for (; i < n && entries[i].token == token; ++i) {
        if (i + kGradientPrefetchDistance < n) {
          PrefetchRow(grads + static_cast<int64_t>(
                                  entries[i + kGradientPrefetchDistance].activation) * dim,
                      row_bytes);
        }
        // A row's lines are fetched once, for the first of its contributions (a row has ~5).
        if (i + kRowPrefetchDistance < n &&
            entries[i + kRowPrefetchDistance].token !=
                entries[i + kRowPrefetchDistance - 1].token) {
          const int64_t ahead = (shard_row + entries[i + kRowPrefetchDistance].token) * dim;
          PrefetchRow(table + ahead, row_bytes);
          for (size_t k = 0; k < kNumSlots; ++k) PrefetchRow(slots[k] + ahead, row_bytes);
        }
        const float gain = entries[i].gain;
        if (kSkipNonFinite) {
          if (bad_activation_rows[entries[i].activation] || !std::isfinite(gain)) skip = true;
          if (skip) continue;
        }
        AccumulateScaled(sum.data(), grads + static_cast<int64_t>(entries[i].activation) * dim,
                         gain, dim);
      }
      if (kSkipNonFinite && skip) {
        ++skipped;
        continue;
      }
      const int64_t row = (shard_row + token) * dim;
      for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = slots[k] + row;
      Optimizer::Apply(hypers, learning_rate, sum.data(), table + row, slot_rows, dim, clip);
    }
  }
  return skipped;
}

// One out-of-line copy of UpdateShards per instruction set (the same body, compiled for `target`).
#define SCE_DEFINE_UPDATE_SHARDS(name, target)                                                    \
  template <typename Optimizer, bool kSkipNonFinite>                                             \
  target int64_t name(const CsrView& view, const float* grads, int64_t dim, float learning_rate,  \
                      const float* hypers, const Clip& clip, float* table,                       \
                      const std::array<float*, Optimizer::kSlots.size()>& slots,                 \
                      const uint8_t* bad_activation_rows, int64_t p_begin, int64_t p_end) {      \
    return UpdateShards<Optimizer, kSkipNonFinite>(view, grads, dim, learning_rate, hypers,      \
                                                   clip, table, slots, bad_activation_rows,      \
                                                   p_begin, p_end);                              \
  }
SCE_DEFINE_UPDATE_SHARDS(UpdateShardsAvx512,
                         __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"))))
SCE_DEFINE_UPDATE_SHARDS(UpdateShardsBaseline, )
#undef SCE_DEFINE_UPDATE_SHARDS

// `view` must have passed ValidateCsrView; `grads` is [view.input_size, dim]; `table` and every
// `slots[i]` are [view.table_rows, dim] and are updated in place.
//
// With `bad_activation_rows` null (every gradient and gain is finite: the normal case) this is the
// plain fused update. Otherwise a table row that any contribution with a flagged activation row or
// a non-finite gain would touch is left unchanged (table and slots), and the number of such rows is
// returned. `use_avx512` picks the instruction set (default: what the CPU has; the results are the
// same, see UpdateShards).
template <typename Optimizer, bool kSkipNonFinite>
int64_t FusedUpdateImpl(const CsrView& view, const float* grads, int64_t dim, float learning_rate,
                        const float* hypers, const Clip& clip, float* table,
                        const std::array<float*, Optimizer::kSlots.size()>& slots,
                        const uint8_t* bad_activation_rows, const ParallelFor& parallel_for,
                        bool use_avx512) {
  std::atomic<int64_t> skipped{0};
  const int64_t cost = SaturatingMul(
      SaturatingMul(200, view.num_token_ids / view.num_shards() + 1), std::max<int64_t>(dim, 1));
  // Shards own disjoint table rows, so they are updated in parallel without locks.
  parallel_for(view.local_shards(), cost, [&](int64_t p_begin, int64_t p_end) {
    const int64_t local_skipped =
        use_avx512
            ? UpdateShardsAvx512<Optimizer, kSkipNonFinite>(view, grads, dim, learning_rate,
                                                            hypers, clip, table, slots,
                                                            bad_activation_rows, p_begin, p_end)
            : UpdateShardsBaseline<Optimizer, kSkipNonFinite>(view, grads, dim, learning_rate,
                                                              hypers, clip, table, slots,
                                                              bad_activation_rows, p_begin,
                                                              p_end);
    if (local_skipped > 0) skipped += local_skipped;
  });
  return skipped.load();
}

template <typename Optimizer>
int64_t FusedUpdate(const CsrView& view, const float* grads, int64_t dim, float learning_rate,
                    const float* hypers, const Clip& clip, float* table,
                    const std::array<float*, Optimizer::kSlots.size()>& slots,
                    const ParallelFor& parallel_for,
                    const uint8_t* bad_activation_rows = nullptr,
                    bool use_avx512 = CpuHasAvx512()) {
  if (bad_activation_rows == nullptr) {
    return FusedUpdateImpl<Optimizer, false>(view, grads, dim, learning_rate, hypers, clip, table,
                                             slots, nullptr, parallel_for, use_avx512);
  }
  return FusedUpdateImpl<Optimizer, true>(view, grads, dim, learning_rate, hypers, clip, table,
                                          slots, bad_activation_rows, parallel_for, use_avx512);
}

}  // namespace sce

#endif  // SCE_CORE_FUSED_UPDATE_H_
