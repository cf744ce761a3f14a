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
//
// With rows_per_sparse_core > 0, also the partition statistics of the stacked COO whose cols are
// `ids` and whose sample rows are `row_ids` (same length, nondecreasing, in
// [0, sparse_cores_per_replica * rows_per_sparse_core)): `max_ids` and `max_unique_ids`, the most
// ids (one per sample) and unique ids of one (source SparseCore, target shard) partition, equal
// to the max_ids / max_uniques of SceGetMinibatchSplitsWithPhysicalReplica at
// max_division_level 0 without limits. With rows_per_sparse_core = 0 they are 0 and row_ids is
// not read (pass an empty vector).
REGISTER_OP("SceRouteIdsToOwners")
    .Input("ids: int32")
    .Input("row_ids: int32")
    .Output("rows: int32")
    .Output("counts: int32")
    .Output("positions: int32")
    .Output("max_ids: int32")
    .Output("max_unique_ids: int32")
    .Attr("num_replicas: int >= 1")
    .Attr("sparse_cores_per_replica: int >= 1")
    .Attr("rows_per_shard: int >= 1")
    .Attr("rows_per_sparse_core: int >= 0 = 0")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      int64_t replicas;
      TF_RETURN_IF_ERROR(c->GetAttr("num_replicas", &replicas));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(replicas));
      c->set_output(2, ids);
      c->set_output(3, c->Scalar());
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
