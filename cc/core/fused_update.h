// The backward pass with a fused optimizer (spec §14.2): gradients of every entry that references
// a table row are summed first (across samples, SparseCores, minibatches and features), then the
// optimizer updates that row once, in place. Rows that are not referenced are never touched, so the
// cost of a step depends on the batch, not on the vocabulary size.
#ifndef SCE_CORE_FUSED_UPDATE_H_
#define SCE_CORE_FUSED_UPDATE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

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

// `view` must have passed ValidateCsrView; `grads` is [view.input_size, dim]; `table` and every
// `slots[i]` are [view.table_rows, dim] and are updated in place.
template <typename Optimizer>
void FusedUpdate(const CsrView& view, const float* grads, int64_t dim, float learning_rate,
                 const float* hypers, const Clip& clip, float* table,
                 const std::array<float*, Optimizer::kSlots.size()>& slots,
                 const ParallelFor& parallel_for) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t rows_per_shard = view.rows_per_shard();
  // Shards own disjoint table rows, so they are updated in parallel without locks.
  parallel_for(view.local_shards(), 200 * (view.num_token_ids / view.num_shards() + 1) * dim,
               [&](int64_t p_begin, int64_t p_end) {
    std::vector<RowContribution> entries;
    std::vector<float> sum(dim);
    float* slot_rows[kNumSlots + 1];
    for (int64_t p = p_begin; p < p_end; ++p) {
      CollectShardContributions(view, view.first_local_shard + p, &entries);
      for (size_t i = 0; i < entries.size();) {
        const int32_t token = entries[i].token;
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (; i < entries.size() && entries[i].token == token; ++i) {
          const float gain = entries[i].gain;
          const float* g = grads + static_cast<int64_t>(entries[i].activation) * dim;
          AccumulateScaled(sum.data(), g, gain, dim);
        }
        const int64_t row = (p * rows_per_shard + token) * dim;
        for (size_t k = 0; k < kNumSlots; ++k) slot_rows[k] = slots[k] + row;
        Optimizer::Apply(hypers, learning_rate, sum.data(), table + row, slot_rows, dim, clip);
      }
    }
  });
}

}  // namespace sce

#endif  // SCE_CORE_FUSED_UPDATE_H_
