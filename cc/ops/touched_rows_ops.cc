// Registration of SceMarkTouchedRows: marks, in a uint8 flags variable, the rows of a table
// variable that the fused update of the same CSR inputs writes (cc/core/touched_rows.h). Delta
// exports (docs/deltas.md) send the marked rows; the flags are cleared when a delta is taken.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The CSR inputs and shard attributes are the fused update's (fused_update_ops.cc); the update's
// activation row count (the rows of its activation_gradients) stands in for the gradients, which
// only bound the sample ids. flags: a uint8 [table rows] variable, the table variable's height.
REGISTER_OP("SceMarkTouchedRows")
    .Input("row_pointers: int32")
    .Input("sorted_sample_ids: int32")
    .Input("sorted_token_ids: int32")
    .Input("sorted_gains: float32")
    .Input("num_minibatches_per_physical_sparse_core: int32")
    .Input("activation_rows: int64")
    .Input("flags: resource")
    .Attr("table_name: string")
    .Attr("num_sparsecores_per_device: int = -1")
    .Attr("num_replica: int = 1")
    .Attr("num_source_replicas: int = 1")
    .Attr("first_local_shard: int = 0")
    .Attr("num_local_shards: int = -1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      return c->WithRank(c->input(5), 0, &unused);
    });

}  // namespace
}  // namespace tensorflow
