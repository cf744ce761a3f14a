#include "cc/core/fused_update.h"

#include "cc/core/radix_sort.h"

namespace sce {

__attribute__((target_clones("avx2", "default"))) void AccumulateScaled(float* sum, const float* g,
                                                                        float gain, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) sum[j] += gain * g[j];
}

void CollectShardContributions(const CsrView& view, int64_t p, std::vector<RowContribution>* out) {
  out->clear();
  const int64_t samples_per_sc = view.samples_per_sc();
  bool sorted = true;
  for (int64_t s = 0; s < view.num_source_sparse_cores(); ++s) {
    for (int64_t b = 0; b < view.num_minibatches; ++b) {
      int64_t begin, end;
      view.Segment(s, b, p, &begin, &end);
      for (int64_t i = begin; i < end; ++i) {
        const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
        if (token == kPad || sample == kPad) continue;
        if (!out->empty() && out->back().token > token) sorted = false;
        out->push_back({token, static_cast<int32_t>(s * samples_per_sc + sample), view.gains[i]});
      }
    }
  }
  // Segments are each sorted by token; merging them is a stable sort of the concatenation.
  if (!sorted) {
    thread_local std::vector<int32_t> tokens;
    thread_local std::vector<uint32_t> order, scratch;
    thread_local std::vector<RowContribution> merged;
    tokens.resize(out->size());
    for (size_t i = 0; i < out->size(); ++i) tokens[i] = (*out)[i].token;
    StableSortByKey(tokens.data(), static_cast<int64_t>(tokens.size()), &order, &scratch);
    merged.resize(out->size());
    for (size_t i = 0; i < order.size(); ++i) merged[i] = (*out)[order[i]];
    out->swap(merged);
  }
}

}  // namespace sce
