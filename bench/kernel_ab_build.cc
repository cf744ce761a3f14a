// One build of the core kernels, behind a C interface, for bench/kernel_ab.py: compiled once from
// each source tree being compared into its own shared library, so both builds run in one process
// (see kernel_ab_main.cc). Only the kernels' public entry points are called, with serial
// ParallelFor, so any two trees with these signatures can be compared.
#include <array>
#include <cstdint>
#include <vector>

#include "cc/core/activation_rows.h"
#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/core/lookup.h"
#include "cc/core/row_precision.h"

extern "C" {

__attribute__((visibility("default"))) void KernelAbForward(const sce::CsrView* view,
                                                            const float* table, int64_t dim,
                                                            float* activations) {
  sce::SparseDenseMatmul(*view, table, dim, sce::Quantization(), activations, sce::RunSerially);
}

// The forward lookup of a bfloat16 table (`table` holds [rows, dim] bfloat16 values).
__attribute__((visibility("default"))) void KernelAbForwardBfloat16(const sce::CsrView* view,
                                                                    const void* table, int64_t dim,
                                                                    float* activations) {
  sce::SparseDenseMatmul(*view, static_cast<const sce::Bfloat16*>(table), dim, sce::Quantization(),
                         activations, sce::RunSerially);
}

// The fused updates read their gradients as `GradientRows` says (cc/core/activation_rows.h): one
// buffer in the CSR's order (`num_feature_rows` 0, one part), or feature-major, one buffer per
// feature as the class passes them with one replica (`num_parts` == `num_feature_rows`).
namespace {

sce::GradientRows Gradients(const sce::CsrView& view, const float* const* parts, int64_t num_parts,
                            const int64_t* feature_rows, int64_t num_feature_rows, int64_t dim) {
  return sce::GradientRows(view,
                           sce::FeatureRowsPerSc(feature_rows, feature_rows + num_feature_rows),
                           std::vector<const float*>(parts, parts + num_parts), dim);
}

}  // namespace

__attribute__((visibility("default"))) void KernelAbAdagrad(
    const sce::CsrView* view, const float* const* parts, int64_t num_parts,
    const int64_t* feature_rows, int64_t num_feature_rows, int64_t dim, float* table,
    float* accumulator, const int64_t* /*member_rows*/, const int64_t* /*member_rotations*/,
    int64_t /*num_members*/) {
  const sce::GradientRows grads =
      Gradients(*view, parts, num_parts, feature_rows, num_feature_rows, dim);
  sce::FusedUpdate<sce::AdagradOptimizer>(*view, grads, dim, 0.01f, nullptr, sce::Clip(), table,
                                          {accumulator}, sce::RunSerially);
}

__attribute__((visibility("default"))) void KernelAbSgd(
    const sce::CsrView* view, const float* const* parts, int64_t num_parts,
    const int64_t* feature_rows, int64_t num_feature_rows, int64_t dim, float* table,
    float* /*unused*/, const int64_t* /*member_rows*/, const int64_t* /*member_rotations*/,
    int64_t /*num_members*/) {
  const sce::GradientRows grads =
      Gradients(*view, parts, num_parts, feature_rows, num_feature_rows, dim);
  sce::FusedUpdate<sce::SgdOptimizer>(*view, grads, dim, 0.01f, nullptr, sce::Clip(), table, {},
                                      sce::RunSerially);
}

// Fused Adagrad on a bfloat16 table with stochastic rounding; every call is the next step, so the
// rounding bits change from call to call as in training. The member tables are the stacked
// table's (each with its own seed), as the class passes them.
__attribute__((visibility("default"))) void KernelAbAdagradBfloat16(
    const sce::CsrView* view, const float* const* parts, int64_t num_parts,
    const int64_t* feature_rows, int64_t num_feature_rows, int64_t dim, void* table,
    float* accumulator, const int64_t* member_rows, const int64_t* member_rotations,
    int64_t num_members) {
  static int64_t step = 0;
  const sce::GradientRows grads =
      Gradients(*view, parts, num_parts, feature_rows, num_feature_rows, dim);
  sce::RowRounding rounding;
  for (int64_t m = 0; m < num_members; ++m) {
    rounding.members.push_back(
        {member_rows[m], member_rotations[m], 12345u + static_cast<uint64_t>(m)});
  }
  rounding.num_shards = view->num_shards();
  rounding.step = step++;
  int64_t overflow_row = -1;
  sce::FusedUpdateNarrow<sce::AdagradOptimizer>(
      *view, grads, dim, 0.01f, nullptr, sce::Clip(), static_cast<sce::Bfloat16*>(table),
      rounding, {accumulator}, sce::RunSerially, nullptr, &overflow_row);
}

}  // extern "C"
