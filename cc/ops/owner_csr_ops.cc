// Registration of the owner-side CSR of the all-to-all exchange (docs/multi_worker.md#exchange;
// the algorithm is cc/core/owner_csr.h).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// A CSR (one source replica, one minibatch) whose entries update the received `rows` of this
// replica's variable (entry i reads gradient row i) and the number of activation rows the update
// reads (S * ceil(n / S): the gradients padded with zero rows).
REGISTER_OP("SceOwnerCsr")
    .Input("rows: int32")
    .Output("row_pointers: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_token_ids: int32")
    .Output("sorted_gains: float")
    .Output("activation_rows: int32")
    .Attr("num_replicas: int >= 1")
    .Attr("sparse_cores_per_replica: int >= 1")
    .Attr("rows_per_shard: int >= 1")
    .Attr("replica_id: int >= 0")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &rows));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
