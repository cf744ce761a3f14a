#include "cc/core/fused_update.h"

#include "cc/core/radix_sort.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace sce {

bool CpuHasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

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

__attribute__((target_clones("avx2", "default"))) bool AllFinite(const float* x, int64_t n) {
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

void FindNonFiniteContributions(const CsrView& view, const float* grads, int64_t dim,
                                std::vector<uint8_t>* bad_activation_rows,
                                NonFiniteContribution* first) {
  bad_activation_rows->assign(view.input_size, 0);
  for (int64_t r = 0; r < view.input_size; ++r) {
    (*bad_activation_rows)[r] = AllFinite(grads + r * dim, dim) ? 0 : 1;
  }
  *first = NonFiniteContribution();
  const int64_t samples_per_sc = view.samples_per_sc();
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

namespace {

// Merges the sorted runs out[bounds[j], bounds[j + 1]) into one sequence sorted by token; ties
// keep run order, then position (a stable sort of the concatenation). At most kMaxMergeWays
// non-empty runs.
constexpr int kMaxMergeWays = 16;

void MergeSortedRuns(const std::vector<size_t>& bounds, std::vector<RowContribution>* out) {
  size_t heads[kMaxMergeWays], ends[kMaxMergeWays];
  int ways = 0;
  for (size_t j = 0; j + 1 < bounds.size(); ++j) {
    if (bounds[j] == bounds[j + 1]) continue;
    heads[ways] = bounds[j];
    ends[ways] = bounds[j + 1];
    ++ways;
  }
  thread_local std::vector<RowContribution> merged;
  merged.resize(out->size());
  const RowContribution* in = out->data();
  for (size_t o = 0; o < merged.size();) {
    // The next entry comes from the earliest run whose head has the smallest token.
    int best = -1;
    for (int j = 0; j < ways; ++j) {
      if (heads[j] < ends[j] && (best < 0 || in[heads[j]].token < in[heads[best]].token)) best = j;
    }
    // Copy from it while its next token still precedes every other head: strictly below the
    // heads of earlier runs, and not above those of later runs (ties keep run order).
    int64_t below_earlier = INT64_MAX, up_to_later = INT64_MAX;
    for (int j = 0; j < ways; ++j) {
      if (j == best || heads[j] == ends[j]) continue;
      int64_t& bound = j < best ? below_earlier : up_to_later;
      bound = std::min<int64_t>(bound, in[heads[j]].token);
    }
    size_t& h = heads[best];
    do {
      merged[o++] = in[h++];
    } while (h < ends[best] && in[h].token < below_earlier && in[h].token <= up_to_later);
  }
  out->swap(merged);
}

}  // namespace

void CollectShardContributions(const CsrView& view, int64_t p, std::vector<RowContribution>* out) {
  out->clear();
  thread_local std::vector<size_t> bounds;
  bounds.clear();
  const int64_t samples_per_sc = view.samples_per_sc();
  bool sorted = true;        // the whole concatenation
  bool runs_sorted = true;   // each segment (the ops' own CSR buffers always are)
  int runs = 0;
  for (int64_t s = 0; s < view.num_source_sparse_cores(); ++s) {
    for (int64_t b = 0; b < view.num_minibatches; ++b) {
      int64_t begin, end;
      view.Segment(s, b, p, &begin, &end);
      const size_t first = out->size();
      bounds.push_back(first);
      for (int64_t i = begin; i < end; ++i) {
        const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
        if (token == kPad || sample == kPad) continue;
        if (!out->empty() && out->back().token > token) {
          sorted = false;
          if (out->size() > first) runs_sorted = false;
        }
        out->push_back({token, static_cast<int32_t>(s * samples_per_sc + sample), view.gains[i]});
      }
      if (out->size() > first) ++runs;
    }
  }
  bounds.push_back(out->size());
  if (sorted) return;
  // A stable sort of the concatenation by token: a merge when the segments are sorted runs (the
  // CSR the preprocessing ops build), else (a CSR given by hand) a radix sort.
  if (runs_sorted && runs <= kMaxMergeWays) {
    MergeSortedRuns(bounds, out);
    return;
  }
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

}  // namespace sce
