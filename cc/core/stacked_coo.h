// All features of one stacked table in one call: every feature's per-SparseCore COO lists (what
// ConvertToListOfCoo gives, docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform)
// concatenated in SparseCore-major order (SC 0: feature 0, feature 1, ...; SC 1: ...), which is
// the input of the minibatch-splits op. Features convert in parallel (ConvertToCoo), and the
// stacking transform writes every entry straight to its place in the concatenation, instead of one
// op per feature, S lists per feature and a concatenation of S x features pieces.
#ifndef SCE_CORE_STACKED_COO_H_
#define SCE_CORE_STACKED_COO_H_

#include <cstdint>
#include <vector>

#include "cc/core/coo.h"
#include "cc/core/parallel.h"
#include "cc/core/status.h"

namespace sce {

struct StackedFeature {
  IdInput input;
  int64_t sample_count = 0;
  Combiner combiner = Combiner::kSum;
  StackingTransform transform;   // num_sc_per_chip must be the same for every feature
  int64_t vocabulary_size = -1;
  Context context;
};

// Every feature's merged entries (rows are sample ids, non-decreasing) and, per (SparseCore,
// feature) piece, its entry range in the feature and its start in the concatenation.
struct StackedCooParts {
  int64_t num_sc = 0;
  std::vector<CooEntries> per_feature;
  std::vector<int64_t> begin, end;   // [SC * features + feature], ranges in per_feature[feature]
  std::vector<int64_t> offsets;      // [SC * features + feature], start in the concatenation
  int64_t total = 0;                 // entries in all (<= kMaxInt32)
};

// Validates and converts every feature (in parallel over features) and lays out the
// concatenation. The first failing feature in input order determines the error.
Status ConvertFeaturesToStackedCoo(const std::vector<StackedFeature>& features,
                                   const ParallelFor& parallel_for, StackedCooParts* parts);

// Applies each feature's stacking transform and writes rows / cols / gains (`parts.total`
// entries each). Fails (naming the feature) if a stacked col does not fit in int32.
Status WriteStackedCoo(const std::vector<StackedFeature>& features, const StackedCooParts& parts,
                       int32_t* rows, int32_t* cols, float* gains,
                       const ParallelFor& parallel_for);

}  // namespace sce

#endif  // SCE_CORE_STACKED_COO_H_
