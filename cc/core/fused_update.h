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

// sum[0:dim] += gain * g[0:dim] (multiversioned for AVX2; see lookup.cc).
void AccumulateScaled(float* sum, const float* g, float gain, int64_t dim);

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

// `view` must have passed ValidateCsrView; `grads` is [view.input_size, dim]; `table` and every
// `slots[i]` are [view.table_rows, dim] and are updated in place.
//
// With `bad_activation_rows` null (every gradient and gain is finite: the normal case) this is the
// plain fused update. Otherwise a table row that any contribution with a flagged activation row or
// a non-finite gain would touch is left unchanged (table and slots), and the number of such rows is
// returned.
template <typename Optimizer, bool kSkipNonFinite>
int64_t FusedUpdateImpl(const CsrView& view, const float* grads, int64_t dim, float learning_rate,
                        const float* hypers, const Clip& clip, float* table,
                        const std::array<float*, Optimizer::kSlots.size()>& slots,
                        const uint8_t* bad_activation_rows, const ParallelFor& parallel_for) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t rows_per_shard = view.rows_per_shard();
  std::atomic<int64_t> skipped{0};
  const int64_t cost = SaturatingMul(
      SaturatingMul(200, view.num_token_ids / view.num_shards() + 1), std::max<int64_t>(dim, 1));
  // Shards own disjoint table rows, so they are updated in parallel without locks.
  parallel_for(view.local_shards(), cost, [&](int64_t p_begin, int64_t p_end) {
    std::vector<RowContribution> entries;
    std::vector<float> sum(dim);
    float* slot_rows[kNumSlots + 1];
    int64_t local_skipped = 0;
    for (int64_t p = p_begin; p < p_end; ++p) {
      CollectShardContributions(view, view.first_local_shard + p, &entries);
      for (size_t i = 0; i < entries.size();) {
        const int32_t token = entries[i].token;
        std::fill(sum.begin(), sum.end(), 0.0f);
        bool skip = false;
        for (; i < entries.size() && entries[i].token == token; ++i) {
          const float gain = entries[i].gain;
          if (kSkipNonFinite) {
            if (bad_activation_rows[entries[i].activation] || !std::isfinite(gain)) skip = true;
            if (skip) continue;
          }
          const float* g = grads + static_cast<int64_t>(entries[i].activation) * dim;
          AccumulateScaled(sum.data(), g, gain, dim);
        }
        if (kSkipNonFinite && skip) {
          ++local_skipped;
          continue;
        }
        const int64_t row = (p * rows_per_shard + token) * dim;
        for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = slots[k] + row;
        Optimizer::Apply(hypers, learning_rate, sum.data(), table + row, slot_rows, dim, clip);
      }
    }
    if (local_skipped > 0) skipped += local_skipped;
  });
  return skipped.load();
}

template <typename Optimizer>
int64_t FusedUpdate(const CsrView& view, const float* grads, int64_t dim, float learning_rate,
                    const float* hypers, const Clip& clip, float* table,
                    const std::array<float*, Optimizer::kSlots.size()>& slots,
                    const ParallelFor& parallel_for,
                    const uint8_t* bad_activation_rows = nullptr) {
  if (bad_activation_rows == nullptr) {
    return FusedUpdateImpl<Optimizer, false>(view, grads, dim, learning_rate, hypers, clip, table,
                                             slots, nullptr, parallel_for);
  }
  return FusedUpdateImpl<Optimizer, true>(view, grads, dim, learning_rate, hypers, clip, table,
                                          slots, bad_activation_rows, parallel_for);
}

}  // namespace sce

#endif  // SCE_CORE_FUSED_UPDATE_H_
