#include "cc/core/activation_rows.h"

#include "cc/core/checked_math.h"

namespace sce {

Status ValidateFeatureRows(const FeatureRowsPerSc& feature_rows_per_sc, const CsrView& view) {
  if (feature_rows_per_sc.empty()) return Status::Ok();
  int64_t total = 0;
  for (int64_t rows : feature_rows_per_sc) {
    if (rows < 0) {
      return InvalidArgument("table '", view.table_name,
                             "': feature_rows_per_sc must hold sizes >= 0, got ", rows);
    }
    if (!CheckedAdd(total, rows, &total)) {
      return InvalidArgument("table '", view.table_name,
                             "': the sizes in feature_rows_per_sc overflow int64");
    }
  }
  if (total != view.samples_per_sc()) {
    return InvalidArgument("table '", view.table_name, "': feature_rows_per_sc must sum to the ",
                           view.samples_per_sc(), " samples per SparseCore, got ", total);
  }
  return Status::Ok();
}

FeatureMajorRows MakeFeatureMajorRows(const CsrView& view, const FeatureRowsPerSc& rows) {
  FeatureMajorRows result;
  const int64_t S = view.num_sc_per_device, samples_per_sc = view.samples_per_sc();
  const int64_t replica_rows = S * samples_per_sc;
  const int64_t F = static_cast<int64_t>(rows.size());
  result.out_row.resize(view.input_size);
  result.runs.resize(view.num_source_sparse_cores() * F);
  for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
    const int64_t g = sc / S, s = sc % S;
    int64_t local = 0;  // first sample of feature f in the SparseCore's block
    for (int64_t f = 0; f < F; ++f) {
      const int64_t first = g * replica_rows + S * local + s * rows[f];
      result.runs[sc * F + f] = {first, rows[f]};
      for (int64_t j = 0; j < rows[f]; ++j) {
        result.out_row[sc * samples_per_sc + local + j] = static_cast<int32_t>(first + j);
      }
      local += rows[f];
    }
  }
  return result;
}

Status ValidateGradientParts(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
                             const std::vector<int64_t>& part_rows, const char* argument) {
  const size_t parts = part_rows.size();
  if (parts == 1) {
    if (part_rows[0] != view.input_size) {
      return InvalidArgument("table '", view.table_name, "': ", argument, " has ", part_rows[0],
                             " rows, expected ", view.input_size);
    }
    return Status::Ok();
  }
  if (parts != feature_rows_per_sc.size()) {
    return InvalidArgument("table '", view.table_name, "': ", argument, " holds ", parts,
                           " tensors; give one, or one per entry of feature_rows_per_sc (",
                           feature_rows_per_sc.size(), ")");
  }
  for (size_t f = 0; f < parts; ++f) {
    int64_t expected;
    if (!CheckedMul(view.num_source_sparse_cores(), feature_rows_per_sc[f], &expected) ||
        part_rows[f] != expected) {
      return InvalidArgument("table '", view.table_name, "': ", argument, "[", f, "] has ",
                             part_rows[f], " rows, expected ", view.num_source_sparse_cores(),
                             " source SparseCores x ", feature_rows_per_sc[f],
                             " rows of feature ", f);
    }
  }
  return Status::Ok();
}

std::vector<const float*> GradientRowAddresses(const CsrView& view,
                                               const FeatureRowsPerSc& feature_rows_per_sc,
                                               const std::vector<const float*>& parts,
                                               int64_t dim) {
  // Feature f's rows of source SparseCore sc start at row runs[sc * F + f].first of the one
  // feature-major buffer, or at row sc * rows_f of feature f's own buffer.
  const FeatureMajorRows order = MakeFeatureMajorRows(view, feature_rows_per_sc);
  const bool per_feature = parts.size() > 1;
  const int64_t F = static_cast<int64_t>(feature_rows_per_sc.size());
  const int64_t samples_per_sc = view.samples_per_sc();
  std::vector<const float*> address(view.input_size);
  for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
    int64_t local = 0;  // first sample of feature f in the SparseCore's block
    for (int64_t f = 0; f < F; ++f) {
      const int64_t rows = feature_rows_per_sc[f];
      const float* first = per_feature ? parts[f] + sc * rows * dim
                                       : parts[0] + order.runs[sc * F + f].first * dim;
      for (int64_t j = 0; j < rows; ++j) address[sc * samples_per_sc + local + j] = first + j * dim;
      local += rows;
    }
  }
  return address;
}

}  // namespace sce
