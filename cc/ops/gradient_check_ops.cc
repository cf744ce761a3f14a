// Registration of the all-or-nothing non-finite gradient check
// (docs/optimizers.md#non-finite-gradients). The op is stateless on purpose: TensorFlow's
// automatic control dependencies chain stateful ops without resource inputs (Assert,
// CheckNumerics) in program order across the replicas of a MirroredStrategy function, which can
// make one replica's check wait for another replica's collective that waits for the check.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Fails with InvalidArgument naming every feature (and its table) whose entry of `non_finite`
// is non-zero; otherwise forwards `values` unchanged (no copy). The values are what the step
// consumes after the check (the gradients): a data dependency, because Grappler prunes a stateless
// node whose outputs only feed control edges (the check did not run with the meta-optimizer on).
REGISTER_OP("SceRequireFiniteGradients")
    .Input("non_finite: int32")
    .Input("values: T")
    .Output("checked: T")
    .Attr("T: list(type) >= 0")
    .Attr("feature_names: list(string)")
    .Attr("table_names: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle flags;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &flags));
      for (int i = 1; i < c->num_inputs(); ++i) c->set_output(i - 1, c->input(i));
      return absl::OkStatus();
    });

// 1 for each of the N float tensors that has a NaN or Inf, else 0 (one vectorized pass over each,
// tensors in parallel).
REGISTER_OP("SceNonFiniteFlags")
    .Input("values: N * float")
    .Output("non_finite: int32")
    .Attr("N: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      c->set_output(0, c->Vector(n));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
