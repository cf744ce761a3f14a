#include "cc/core/gradient_check.h"

#include <sstream>

namespace sce {

Status RequireFiniteFeatureGradients(const int32_t* non_finite, int64_t num_features,
                                     const std::vector<std::string>& feature_names,
                                     const std::vector<std::string>& table_names) {
  if (num_features < 0 || static_cast<uint64_t>(num_features) != feature_names.size() ||
      feature_names.size() != table_names.size()) {
    return InvalidArgument("non_finite must have one entry per feature: got ", num_features,
                           " entries, ", feature_names.size(), " feature names and ",
                           table_names.size(), " table names");
  }
  if (num_features > 0 && non_finite == nullptr) {
    return InvalidArgument("non_finite is missing");
  }
  std::ostringstream features;
  int64_t marked = 0;
  for (int64_t i = 0; i < num_features; ++i) {
    if (non_finite[i] == 0) continue;
    features << (marked++ ? ", " : "") << "feature '" << feature_names[i] << "' (table '"
             << table_names[i] << "')";
  }
  if (marked == 0) return Status::Ok();
  return InvalidArgument(
      features.str(), ": the gradient of the activations has NaN or Inf values (on at least one ",
      "replica); the step was stopped before any table or optimizer slot was written. ",
      "TPUEmbeddingV2(non_finite_gradients='skip') leaves the rows of such gradients unchanged "
      "and counts them instead");
}

}  // namespace sce
