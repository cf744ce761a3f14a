// Registration of the online partition-limit update (docs/preprocessing.md#online-limits): a
// resource op, so TensorFlow orders it by its variable and never chains it with other replicas'
// collectives (see cc/ops/gradient_check_ops.cc).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// limits (int32 [tables, 2] variable) = max(limits, observed), logging every raised limit;
// returns the limits after the update.
REGISTER_OP("SceRaiseSparseCoreLimits")
    .Input("limits: resource")
    .Input("observed: int32")
    .Output("limits_after: int32")
    .Attr("table_names: list(string)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle observed;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &observed));
      c->set_output(0, observed);
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
