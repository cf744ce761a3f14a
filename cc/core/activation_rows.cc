#include "cc/core/activation_rows.h"

#include <algorithm>

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

namespace {

// The first row, in a feature-major order, of the `rows_f` samples of source SparseCore `sc`
// that begin at sample `local` of its block: each source replica's rows are ordered feature by
// feature, and within a feature SparseCore by SparseCore.
int64_t FeatureMajorFirstRow(const CsrView& view, int64_t sc, int64_t local, int64_t rows_f) {
  const int64_t S = view.num_sc_per_device;
  const int64_t g = sc / S, s = sc % S;
  return g * S * view.samples_per_sc() + S * local + s * rows_f;
}

}  // namespace

FeatureMajorRows MakeFeatureMajorRows(const CsrView& view, const FeatureRowsPerSc& rows) {
  FeatureMajorRows result;
  const int64_t samples_per_sc = view.samples_per_sc();
  const int64_t F = static_cast<int64_t>(rows.size());
  result.out_row.resize(view.input_size);
  result.runs.resize(view.num_source_sparse_cores() * F);
  for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
    int64_t local = 0;  // first sample of feature f in the SparseCore's block
    for (int64_t f = 0; f < F; ++f) {
      const int64_t first = FeatureMajorFirstRow(view, sc, local, rows[f]);
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

GradientRows::GradientRows(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
                           const std::vector<const float*>& parts, int64_t dim)
    : row_bytes_(static_cast<uintptr_t>(dim) * sizeof(float)) {
  // The CSR's order is the feature-major order of a single feature that spans every sample.
  const FeatureRowsPerSc rows =
      feature_rows_per_sc.empty() ? FeatureRowsPerSc{view.samples_per_sc()} : feature_rows_per_sc;
  num_features_ = static_cast<int64_t>(rows.size());
  const int64_t F = num_features_;
  const bool per_feature = parts.size() > 1;
  if (F > 1) {
    feature_of_sample_.resize(view.samples_per_sc());
    int64_t local = 0;
    for (int64_t f = 0; f < F; ++f) {
      std::fill_n(feature_of_sample_.begin() + local, rows[f], static_cast<int32_t>(f));
      local += rows[f];
    }
  }
  origin_.resize(view.num_source_sparse_cores() * F);
  for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
    int64_t local = 0;  // first sample of feature f in the SparseCore's block
    for (int64_t f = 0; f < F; ++f) {
      // Sample `local` of the pair is at row `first` of its buffer.
      const int64_t first = per_feature ? sc * rows[f]
                                        : FeatureMajorFirstRow(view, sc, local, rows[f]);
      const uintptr_t base = reinterpret_cast<uintptr_t>(parts[per_feature ? f : 0]);
      origin_[sc * F + f] = base + static_cast<uintptr_t>(first) * row_bytes_ -
                            static_cast<uintptr_t>(local) * row_bytes_;
      local += rows[f];
    }
  }
}

}  // namespace sce
