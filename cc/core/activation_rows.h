// Where each activation row lives (docs/lookup.md#activation-row-order): the one home of the row
// order rule that the forward lookup writes and the fused update reads its gradients in.
//
// The CSR numbers activation rows SparseCore-major: row sc * samples_per_sc + sample, sc counting
// the source SparseCores of every source replica. A stacked table's features tile each
// SparseCore's block of samples, so that order interleaves the features. The lookup can instead
// write each source replica's rows feature-major, and the update can read gradients given in that
// order, as one buffer or as one buffer per feature: each feature's rows are then contiguous and
// the embedding needs neither a split of the activations nor a concatenation of the gradients.
#ifndef SCE_CORE_ACTIVATION_ROWS_H_
#define SCE_CORE_ACTIVATION_ROWS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "cc/core/csr_view.h"
#include "cc/core/status.h"

namespace sce {

// Empty: the CSR's own (SparseCore-major) order. Otherwise every SparseCore's block of samples is
// cut into consecutive feature parts of these sizes, and each source replica's rows are ordered
// feature-major: feature 0's rows of SparseCore 0, 1, ..., then feature 1's, and so on.
using FeatureRowsPerSc = std::vector<int64_t>;

// The sizes must be >= 0 and sum to the view's samples per SparseCore. `view` must have passed
// ValidateCsrView.
Status ValidateFeatureRows(const FeatureRowsPerSc& feature_rows_per_sc, const CsrView& view);

// Feature-major order: the row of every (source SparseCore, sample), and per source SparseCore
// its runs of rows (first row, count), one per feature. `rows` must have passed
// ValidateFeatureRows.
struct FeatureMajorRows {
  std::vector<int32_t> out_row;                   // [view.input_size]
  std::vector<std::pair<int64_t, int64_t>> runs;  // [sc * F + f]
};
FeatureMajorRows MakeFeatureMajorRows(const CsrView& view, const FeatureRowsPerSc& rows);

// The gradients of one update may come as
//  * one buffer of view.input_size rows: in CSR order when `feature_rows_per_sc` is empty, else
//    in feature-major order;
//  * one buffer per feature (`feature_rows_per_sc` non-empty, one part per entry): feature f's
//    buffer holds num_source_sparse_cores * feature_rows_per_sc[f] rows, source SparseCore-major
//    (for one source replica: exactly that feature's [batch, dim] activations' gradient).
// `part_rows` gives each buffer's row count. Ok when they fit; otherwise InvalidArgument naming
// the table and `argument` (the input's name). `view` must have passed ValidateCsrView and
// `feature_rows_per_sc` ValidateFeatureRows.
Status ValidateGradientParts(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
                             const std::vector<int64_t>& part_rows, const char* argument);

// Where the fused update reads the gradient of sample `sample` of source SparseCore `sc`
// (activation row sc * samples_per_sc + sample in the CSR's numbering). In every order the
// gradients can come in (see ValidateGradientParts), each (source SparseCore, feature) pair's
// rows are consecutive rows of one buffer, so a row's address is that pair's origin plus
// sample * row bytes, and the feature is a function of the sample alone (the same for every
// SparseCore). The update reads two small tables per row: the feature of each sample
// (samples_per_sc entries, not built when there is one feature) and the origins
// (num_source_sparse_cores * F entries). One address per activation row instead would be a table
// as large as the activations' row count, read at random, and it does not stay in cache.
//
// This is the rule as a small value that a loop copies into local variables (GradientRows owns
// the tables). Read through a reference to the owning object instead, the compiler may reload
// the feature count, the tables' addresses and the row size from memory for every gradient row:
// as far as it can tell, the update loop's own stores (its int64 run cursors, the
// contributions it lists) might have changed them. With the copy, the fused updates with one
// gradient buffer per feature take 2-5% less time (bench/kernel_ab.py --gradients per-feature;
// BENCHMARKS.md, "Design measurements").
struct GradientRowAddressing {
  const int32_t* feature_of_sample;  // [samples_per_sc]; unused when num_features is 1
  const uintptr_t* origin;           // [num_source_sparse_cores * num_features]
  int64_t num_features;
  uintptr_t row_bytes;

  // The origins of source SparseCore `sc`'s features, to pass to Row.
  __attribute__((always_inline)) const uintptr_t* OriginsOf(int64_t sc) const {
    return origin + sc * num_features;
  }

  // The gradient row of sample `sample` of the source SparseCore whose origins are `origins`.
  // Unsigned arithmetic: an origin may lie before its buffer (it stands for sample 0), so only
  // the sum is an address.
  __attribute__((always_inline)) const float* Row(const uintptr_t* origins, int64_t sample) const {
    const int64_t f = num_features == 1 ? 0 : feature_of_sample[sample];
    return reinterpret_cast<const float*>(origins[f] + static_cast<uintptr_t>(sample) * row_bytes);
  }
  const float* Row(int64_t sc, int64_t sample) const { return Row(OriginsOf(sc), sample); }
};

// The gradients of one update and the tables of their addressing rule.
class GradientRows {
 public:
  // The gradients in `parts` (see ValidateGradientParts, which they must have passed): one buffer
  // in the CSR's order when `feature_rows_per_sc` is empty, else feature-major (one buffer, or
  // one per feature). `view` must have passed ValidateCsrView and `feature_rows_per_sc`
  // ValidateFeatureRows. The buffers are not copied: they must outlive this object.
  GradientRows(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
               const std::vector<const float*>& parts, int64_t dim);

  // One buffer of view.input_size rows in the CSR's order.
  static GradientRows InCsrOrder(const CsrView& view, const float* data, int64_t dim) {
    return GradientRows(view, FeatureRowsPerSc(), {data}, dim);
  }

  // The addressing rule; valid while this object lives.
  GradientRowAddressing Addressing() const {
    return {feature_of_sample_.data(), origin_.data(), num_features_, row_bytes_};
  }

 private:
  int64_t num_features_ = 1;
  uintptr_t row_bytes_ = 0;
  std::vector<int32_t> feature_of_sample_;  // [samples_per_sc] when num_features_ > 1
  std::vector<uintptr_t> origin_;           // [num_source_sparse_cores * num_features_]
};

}  // namespace sce

#endif  // SCE_CORE_ACTIVATION_ROWS_H_
