// Registration of the grouped forward lookup (docs/lookup.md#grouping-at-enqueue; the algorithm is
// cc/core/grouped_entries.h): an op that groups a CSR's entries by activation row once per batch,
// and the lookup over that grouping, in a tensor form and a resource form that reads the table
// variable in place.
#include <string>

#include "cc/core/checked_math.h"
#include "cc/ops/table_shape.h"

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("SceGroupLookupEntries")
    .Input("row_pointers: int32")
    .Input("sorted_sample_ids: int32")
    .Input("sorted_token_ids: int32")
    .Input("sorted_gains: float32")
    .Input("num_minibatches_per_physical_sparse_core: int32")
    .Output("activation_row_begin: int32")
    .Output("entry_rows: int32")
    .Output("entry_gains: float32")
    .Attr("input_size: int >= 0")
    .Attr("table_rows: int >= 0")
    .Attr("table_name: string")
    .Attr("num_sparsecores_per_device: int = -1")
    .Attr("num_replica: int = 1")
    .Attr("num_source_replicas: int = 1")
    .Attr("first_local_shard: int = 0")
    .Attr("num_local_shards: int = -1")
    .Attr("feature_rows_per_sc: list(int) = []")
    .SetShapeFn([](InferenceContext* c) {
      int64_t input_size;
      TF_RETURN_IF_ERROR(c->GetAttr("input_size", &input_size));
      // activation_row_begin has input_size + 1 int32 entries.
      if (input_size >= sce::kMaxInt32) {
        std::string table;
        TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", table, "': input_size must be below ", sce::kMaxInt32, ", got ", input_size));
      }
      c->set_output(0, c->Vector(input_size + 1));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

// [activation_row_begin's length - 1, the table's dim].
absl::Status GroupedActivationShape(InferenceContext* c, ShapeHandle table) {
  ShapeHandle row_begin;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &row_begin));
  DimensionHandle rows = c->UnknownDim();
  if (c->ValueKnown(c->Dim(row_begin, 0))) {
    const int64_t n = c->Value(c->Dim(row_begin, 0));
    if (n < 1) return absl::InvalidArgumentError("activation_row_begin must not be empty");
    rows = c->MakeDim(n - 1);
  }
  c->set_output(0, c->Matrix(rows, c->Dim(table, 1)));
  return absl::OkStatus();
}

void RegisterGroupedLookupOp(const char* name, bool resource) {
  register_op::OpDefBuilderWrapper op(name);
  op.Input("activation_row_begin: int32")
      .Input("entry_rows: int32")
      .Input("entry_gains: float32")
      .Input(resource ? "embedding_table: resource" : "embedding_table: float32")
      .Output("activations: float32")
      .Attr("table_name: string")
      .SetShapeFn([resource](InferenceContext* c) {
        ShapeHandle table;
        TF_RETURN_IF_ERROR(sce_ops::TableShape(c, 3, resource, &table));
        return GroupedActivationShape(c, table);
      });
  op();
}

const bool kRegistered = [] {
  RegisterGroupedLookupOp("SceSparseDenseMatmulGrouped", /*resource=*/false);
  RegisterGroupedLookupOp("SceResourceSparseDenseMatmulGrouped", /*resource=*/true);
  return true;
}();

}  // namespace
}  // namespace tensorflow
