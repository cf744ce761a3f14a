// Registration of step 1 of the all-to-all exchange (docs/multi_worker.md#exchange; the
// algorithm is cc/core/id_routing.h).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The unique ids among `ids` (stacked ids of one table on one replica) as rows of their owners'
// variables, grouped by owner (`rows`), the number per owner (`counts`, [num_replicas]) and, per
// id, the index of its unique id in `rows` (`positions`).
REGISTER_OP("SceRouteIdsToOwners")
    .Input("ids: int32")
    .Output("rows: int32")
    .Output("counts: int32")
    .Output("positions: int32")
    .Attr("num_replicas: int >= 1")
    .Attr("sparse_cores_per_replica: int >= 1")
    .Attr("rows_per_shard: int >= 1")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      int64_t replicas;
      TF_RETURN_IF_ERROR(c->GetAttr("num_replicas", &replicas));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(replicas));
      c->set_output(2, ids);
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
