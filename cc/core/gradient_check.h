// The all-or-nothing check of activation gradients (docs/optimizers.md#non-finite-gradients).
//
// The embedding marks, per feature, whether any replica saw a NaN or Inf in the gradient of that
// feature's activations; this check turns the agreed marks into one error that names every such
// feature and its table, before any table or slot is written.
#ifndef SCE_CORE_GRADIENT_CHECK_H_
#define SCE_CORE_GRADIENT_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

// `non_finite[i]` != 0 marks feature i. `feature_names` and `table_names` have one entry per
// feature (same length as `non_finite`, checked). Ok when no feature is marked.
Status RequireFiniteFeatureGradients(const int32_t* non_finite, int64_t num_features,
                                     const std::vector<std::string>& feature_names,
                                     const std::vector<std::string>& table_names);

}  // namespace sce

#endif  // SCE_CORE_GRADIENT_CHECK_H_
