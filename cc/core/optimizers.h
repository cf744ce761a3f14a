// The one definition of every fused optimizer: its name, its slot variables (in TensorFlow's op
// argument order), its hyperparameters (TensorFlow's op attribute names), and its per-row math
// (docs/optimizers.md#per-row-formulas). Op registrations, kernels, the Python slot creation and the numpy reference in the
// tests are all derived from this table.
#ifndef SCE_CORE_OPTIMIZERS_H_
#define SCE_CORE_OPTIMIZERS_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace sce {

// kFloat and kBool are attributes of those types. kRowWidth is an int attribute: how many leading
// columns of a table row hold the embedding (the rest is layout padding, whose gradient is 0).
// Row-wise optimizers average over it; the kernel checks 1 <= value <= the table's width.
enum class HyperType { kFloat, kBool, kRowWidth };

struct HyperSpec {
  const char* name;
  HyperType type;
};

// A slot holds either one float per table element (kElementWise: the table's shape) or one float
// per table row (kRowWise: [rows, 1]). This is the one rule for a slot's width; the kernels, the
// op registrations, the Python slot variables and checkpoints all derive it from kSlotShapes.
enum class SlotShape { kElementWise, kRowWise };

// The floats one row of a slot holds, for a table of width `dim`.
constexpr int64_t SlotRowWidth(SlotShape shape, int64_t dim) {
  return shape == SlotShape::kRowWise ? 1 : dim;
}

// Applies `clip` to the new table value only (never to slots), as TensorFlow does.
struct Clip {
  float min = -INFINITY;
  float max = INFINITY;
  float operator()(float w) const { return std::min(std::max(w, min), max); }
};

struct SgdOptimizer {
  static constexpr const char* kName = "sgd";
  static constexpr const char* kOpName = "Sgd";
  static constexpr std::array<const char*, 0> kSlots = {};
  static constexpr std::array<SlotShape, 0> kSlotShapes = {};
  static constexpr std::array<HyperSpec, 0> kHypers = {};
  static void Apply(const float* /*h*/, float lr, const float* g, float* w, float** /*slots*/,
                    int64_t dim, const Clip& clip) {
    for (int64_t j = 0; j < dim; ++j) w[j] = clip(w[j] - lr * g[j]);
  }
};

struct AdagradOptimizer {
  static constexpr const char* kName = "adagrad";
  static constexpr const char* kOpName = "Adagrad";
  static constexpr std::array<const char*, 1> kSlots = {"accumulator"};
  static constexpr std::array<SlotShape, 1> kSlotShapes = {SlotShape::kElementWise};
  static constexpr std::array<HyperSpec, 0> kHypers = {};
  static void Apply(const float* /*h*/, float lr, const float* g, float* w, float** slots,
                    int64_t dim, const Clip& clip) {
    float* a = slots[0];
    for (int64_t j = 0; j < dim; ++j) {
      a[j] = a[j] + g[j] * g[j];
      w[j] = clip(w[j] - lr * g[j] / std::sqrt(a[j]));
    }
  }
};

// FBGEMM's exact row-wise Adagrad (its EXACT_ROWWISE_ADAGRAD without weight decay): one
// accumulator per row, grown by the mean of the squared summed gradient over the row's `dim`
// embedding columns; every column then moves by the same multiplier,
//   acc += sum_d(g[d]^2) / dim;   w[d] -= (lr / (sqrt(acc) + epsilon)) * g[d].
// The sum runs in column order (fixed, so results do not depend on the instruction set).
struct RowWiseAdagradOptimizer {
  static constexpr const char* kName = "row_wise_adagrad";
  static constexpr const char* kOpName = "RowWiseAdagrad";
  static constexpr std::array<const char*, 1> kSlots = {"accumulator"};
  static constexpr std::array<SlotShape, 1> kSlotShapes = {SlotShape::kRowWise};
  static constexpr std::array<HyperSpec, 2> kHypers = {{{"epsilon", HyperType::kFloat},
                                                        {"embedding_dim", HyperType::kRowWidth}}};
  static void Apply(const float* h, float lr, const float* g, float* w, float** slots,
                    int64_t dim, const Clip& clip) {
    const float epsilon = h[0];
    const int64_t embedding_dim = static_cast<int64_t>(h[1]);
    float sum_of_squares = 0.0f;
    for (int64_t j = 0; j < embedding_dim; ++j) sum_of_squares += g[j] * g[j];
    float* a = slots[0];
    a[0] = a[0] + sum_of_squares / static_cast<float>(embedding_dim);
    const float multiplier = lr / (std::sqrt(a[0]) + epsilon);
    for (int64_t j = 0; j < dim; ++j) w[j] = clip(w[j] - multiplier * g[j]);
  }
};

struct AdagradMomentumOptimizer {
  static constexpr const char* kName = "adagrad_momentum";
  static constexpr const char* kOpName = "AdagradMomentum";
  static constexpr std::array<const char*, 2> kSlots = {"accumulator", "momenta"};
  static constexpr std::array<SlotShape, 2> kSlotShapes = {SlotShape::kElementWise,
                                                          SlotShape::kElementWise};
  static constexpr std::array<HyperSpec, 5> kHypers = {{{"use_nesterov", HyperType::kBool},
                                                        {"exponent", HyperType::kFloat},
                                                        {"beta1", HyperType::kFloat},
                                                        {"beta2", HyperType::kFloat},
                                                        {"epsilon", HyperType::kFloat}}};
  static void Apply(const float* h, float lr, const float* g, float* w, float** slots,
                    int64_t dim, const Clip& clip) {
    const bool nesterov = h[0] != 0.0f;
    const float neg_inv_exponent = -(1.0f / h[1]);
    const float beta1 = h[2], beta2 = h[3], epsilon = h[4];
    float* a = slots[0];
    float* m = slots[1];
    for (int64_t j = 0; j < dim; ++j) {
      a[j] = beta2 == 1.0f ? a[j] + g[j] * g[j] : beta2 * a[j] + (1.0f - beta2) * g[j] * g[j];
      const float scaled = std::pow(a[j] + epsilon, neg_inv_exponent) * g[j];
      m[j] = beta1 * m[j] + scaled;
      w[j] = clip(nesterov ? w[j] - lr * (beta1 * m[j] + scaled) : w[j] - lr * m[j]);
    }
  }
};

struct AdamOptimizer {
  static constexpr const char* kName = "adam";
  static constexpr const char* kOpName = "Adam";
  static constexpr std::array<const char*, 2> kSlots = {"momenta", "velocity"};
  static constexpr std::array<SlotShape, 2> kSlotShapes = {SlotShape::kElementWise,
                                                          SlotShape::kElementWise};
  static constexpr std::array<HyperSpec, 4> kHypers = {{{"use_sum_inside_sqrt", HyperType::kBool},
                                                        {"beta1", HyperType::kFloat},
                                                        {"beta2", HyperType::kFloat},
                                                        {"epsilon", HyperType::kFloat}}};
  static void Apply(const float* h, float lr, const float* g, float* w, float** slots,
                    int64_t dim, const Clip& clip) {
    const bool sum_inside_sqrt = h[0] != 0.0f;
    const float beta1 = h[1], beta2 = h[2], epsilon = h[3];
    const float inside = sum_inside_sqrt ? epsilon * epsilon : 0.0f;
    const float outside = sum_inside_sqrt ? 0.0f : epsilon;
    float* m = slots[0];
    float* v = slots[1];
    for (int64_t j = 0; j < dim; ++j) {
      m[j] = beta1 * m[j] + (1.0f - beta1) * g[j];
      v[j] = beta2 * v[j] + (1.0f - beta2) * g[j] * g[j];
      w[j] = clip(w[j] - lr * m[j] / (std::sqrt(v[j] + inside) + outside));
    }
  }
};

struct FtrlOptimizer {
  static constexpr const char* kName = "ftrl";
  static constexpr const char* kOpName = "Ftrl";
  static constexpr std::array<const char*, 2> kSlots = {"accumulator", "linear"};
  static constexpr std::array<SlotShape, 2> kSlotShapes = {SlotShape::kElementWise,
                                                          SlotShape::kElementWise};
  static constexpr std::array<HyperSpec, 5> kHypers = {
      {{"multiply_linear_by_learning_rate", HyperType::kBool},
       {"beta", HyperType::kFloat},
       {"learning_rate_power", HyperType::kFloat},
       {"l1_regularization_strength", HyperType::kFloat},
       {"l2_regularization_strength", HyperType::kFloat}}};
  static void Apply(const float* h, float lr, const float* g, float* w, float** slots,
                    int64_t dim, const Clip& clip) {
    const bool multiply_by_lr = h[0] != 0.0f;
    const float beta = h[1], neg_power = -h[2], l1 = h[3], l2 = h[4];
    float* a = slots[0];
    float* lin = slots[1];
    for (int64_t j = 0; j < dim; ++j) {
      const float a_new = a[j] + g[j] * g[j];
      const float p_old = std::pow(a[j], neg_power);
      const float p_new = std::pow(a_new, neg_power);
      const float delta = p_new - p_old;
      float numerator, denominator;
      if (multiply_by_lr) {
        lin[j] = lin[j] + lr * g[j] - delta * w[j];
        const float bound = lr * l1;
        numerator = l1 == 0.0f ? -lin[j] : std::min(std::max(lin[j], -bound), bound) - lin[j];
        denominator = p_new + 2.0f * lr * l2 + beta;
      } else {
        lin[j] = lin[j] + g[j] - delta * w[j] / lr;
        numerator = l1 == 0.0f ? -lin[j] : std::min(std::max(lin[j], -l1), l1) - lin[j];
        denominator = (p_new + beta) / lr + 2.0f * l2;
      }
      a[j] = a_new;
      w[j] = clip(numerator / denominator);
    }
  }
};

// Calls fn.template operator()<Optimizer>() for every optimizer; used to register ops and kernels
// and to describe the optimizers to Python.
template <typename Fn>
void ForEachOptimizer(Fn&& fn) {
  fn.template operator()<SgdOptimizer>();
  fn.template operator()<AdagradOptimizer>();
  fn.template operator()<RowWiseAdagradOptimizer>();
  fn.template operator()<AdagradMomentumOptimizer>();
  fn.template operator()<AdamOptimizer>();
  fn.template operator()<FtrlOptimizer>();
}

}  // namespace sce

#endif  // SCE_CORE_OPTIMIZERS_H_
