// Registration of SceRequire, the library's in-step check. It is stateless on purpose:
// TensorFlow's automatic control dependencies chain stateful ops without resource inputs
// (Assert, CheckNumerics, PrintV2) in program order over the whole function, and under
// MirroredStrategy that function holds every replica's step one after the other. A stateful
// check on the path into one replica's collectives then waits for any such op (the library's or
// the user's, e.g. a tf.print in the dense model) that another replica runs after its
// collectives, which wait for the first replica: a deadlock (docs/multi_worker.md#in-step-checks).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

// Forwards `values` unchanged (no copy) when every element of `condition` is true; otherwise
// fails with InvalidArgument(message). The values are what the step consumes after the check: a
// data dependency, because Grappler prunes a stateless node whose outputs only feed control
// edges.
REGISTER_OP("SceRequire")
    .Input("condition: bool")
    .Input("values: T")
    .Output("checked: T")
    .Attr("T: list(type) >= 0")
    .Attr("message: string")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 1; i < c->num_inputs(); ++i) c->set_output(i - 1, c->input(i));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
