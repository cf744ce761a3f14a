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

// Where the fused update reads the gradient of activation row a (CSR numbering, a in
// [0, view.input_size)): at data + a * dim, or, when `address` is set, at address[a].
struct GradientRows {
  const float* data = nullptr;
  const float* const* address = nullptr;
};

__attribute__((always_inline)) inline const float* GradientRow(const GradientRows& g, int64_t a,
                                                               int64_t dim) {
  return g.address != nullptr ? g.address[a] : g.data + a * dim;
}

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

// The address of every activation row's gradient for gradients in a feature-major order
// (`feature_rows_per_sc` non-empty) validated by ValidateGradientParts. One buffer in the CSR's
// order needs none: GradientRows::data.
std::vector<const float*> GradientRowAddresses(const CsrView& view,
                                               const FeatureRowsPerSc& feature_rows_per_sc,
                                               const std::vector<const float*>& parts,
                                               int64_t dim);

}  // namespace sce

#endif  // SCE_CORE_ACTIVATION_ROWS_H_
