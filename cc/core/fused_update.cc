#include "cc/core/fused_update.h"

#include "cc/core/radix_sort.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace sce {

Status ParseNonFiniteGradients(const std::string& name, NonFiniteGradients* mode) {
  if (name == "error") {
    *mode = NonFiniteGradients::kError;
  } else if (name == "skip") {
    *mode = NonFiniteGradients::kSkip;
  } else {
    return InvalidArgument("non_finite_gradients must be 'error' or 'skip', got '", name, "'");
  }
  return Status::Ok();
}

// The AVX-512 clone: 0.30 instead of 0.44 ms for the 13.6 MB of a benchmark batch's gradients
// when they are in cache (single thread, best of 25); out of cache both take the memory's time.
__attribute__((target_clones("avx512f", "avx2", "default"))) bool AllFinite(const float* x,
                                                                         int64_t n) {
  // A float is NaN or +-Inf exactly when its exponent bits are all ones. OR-ing a per-element
  // flag (no early exit) keeps the loop branch-free so it vectorizes.
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return any == 0;
}

void FindNonFiniteContributions(const CsrView& view, const GradientRows& grads, int64_t dim,
                                std::vector<uint8_t>* bad_activation_rows,
                                NonFiniteContribution* first) {
  bad_activation_rows->assign(view.input_size, 0);
  const int64_t samples_per_sc = view.samples_per_sc();
  const GradientRowAddressing addressing = grads.Addressing();
  for (int64_t s = 0; s < view.num_source_sparse_cores(); ++s) {
    for (int64_t sample = 0; sample < samples_per_sc; ++sample) {
      (*bad_activation_rows)[s * samples_per_sc + sample] =
          AllFinite(addressing.Row(s, sample), dim) ? 0 : 1;
    }
  }
  *first = NonFiniteContribution();
  const int64_t rows_per_shard = view.rows_per_shard();
  for (int64_t p = 0; p < view.local_shards(); ++p) {
    const int64_t shard = view.first_local_shard + p;
    for (int64_t s = 0; s < view.num_source_sparse_cores(); ++s) {
      for (int64_t b = 0; b < view.num_minibatches; ++b) {
        int64_t begin, end;
        view.Segment(s, b, shard, &begin, &end);
        for (int64_t i = begin; i < end; ++i) {
          const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
          if (token == kPad || sample == kPad) continue;
          const int64_t activation = s * samples_per_sc + sample;
          const bool bad_gain = !std::isfinite(view.gains[i]);
          if (!bad_gain && !(*bad_activation_rows)[activation]) continue;
          first->found = true;
          first->shard = shard;
          first->token = token;
          first->table_row = p * rows_per_shard + token;
          first->activation_row = activation;
          first->position = i;
          first->gain = view.gains[i];
          first->bad_gain = bad_gain;
          return;
        }
      }
    }
  }
}

bool FindSortedRuns(const CsrView& view, int64_t p, std::vector<ContributionRun>* runs) {
  runs->clear();
  for (int64_t s = 0; s < view.num_source_sparse_cores(); ++s) {
    for (int64_t b = 0; b < view.num_minibatches; ++b) {
      ContributionRun run;
      view.Segment(s, b, p, &run.next, &run.end);
      run.source_sc = s;
      SkipPadding(view, &run);
      if (run.head_token == kPad) continue;  // no valid entry
      int32_t previous = run.head_token;
      for (int64_t i = run.next + 1; i < run.end; ++i) {
        const int32_t token = view.token_ids[i];
        if (token == kPad || view.sample_ids[i] == kPad) continue;
        if (token < previous) return false;
        previous = token;
      }
      if (runs->size() == kMaxStreamedRuns) return false;
      runs->push_back(run);
    }
  }
  return true;
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
        out->push_back({token, static_cast<int32_t>(s * samples_per_sc + sample), view.gains[i],
                        static_cast<int32_t>(s)});
      }
    }
  }
  if (sorted) return;
  // A stable radix sort of the concatenation by token.
  thread_local std::vector<int32_t> tokens;
  thread_local std::vector<uint32_t> order;
  thread_local std::vector<uint64_t> scratch;
  thread_local std::vector<RowContribution> merged;
  tokens.resize(out->size());
  for (size_t i = 0; i < out->size(); ++i) tokens[i] = (*out)[i].token;
  StableSortByKey(tokens.data(), static_cast<int64_t>(tokens.size()), &order, &scratch);
  merged.resize(out->size());
  for (size_t i = 0; i < order.size(); ++i) merged[i] = (*out)[order[i]];
  out->swap(merged);
}

}  // namespace sce
