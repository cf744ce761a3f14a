// Registration of the forward sparse-dense matmul (docs/lookup.md#forward-lookup), in a tensor form (TensorFlow's
// signature) and a resource form that reads the table variable in place.
#include <string>

#include "cc/core/checked_math.h"

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status ActivationShape(InferenceContext* c, ShapeHandle table) {
  int64_t input_size;
  TF_RETURN_IF_ERROR(c->GetAttr("input_size", &input_size));
  // Activation rows are int32 indices; a larger input_size is reported here (shape inference)
  // and by the kernel, never turned into a dimension.
  if (input_size > sce::kMaxInt32) {
    std::string table;
    TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
    return absl::InvalidArgumentError(absl::StrCat("table '", table, "': input_size must be at most ",
                                                   sce::kMaxInt32, ", got ", input_size));
  }
  c->set_output(0, c->Matrix(input_size, c->Dim(table, 1)));
  return absl::OkStatus();
}

// The tensor form has TensorFlow's signature; the resource form reads the variable in place.
void RegisterLookupOp(const char* name, const char* table_type,
                      absl::Status (*table_shape)(InferenceContext*, ShapeHandle*)) {
  register_op::OpDefBuilderWrapper op(name);
  op.Input("row_pointers: int32")
      .Input("sorted_sample_ids: int32")
      .Input("sorted_token_ids: int32")
      .Input("sorted_gains: float32")
      .Input(std::string("embedding_table: ") + table_type)
      .Input("num_minibatches_per_physical_sparse_core: int32")
      .Output("activations: float32")
      .Attr("input_size: int >= 0")
      .Attr("quantization_config_low: float")
      .Attr("quantization_config_high: float")
      .Attr("quantization_config_num_buckets: int >= 0")
      .Attr("table_name: string")
      .Attr("num_sparsecores_per_device: int = -1")
      .Attr("num_replica: int = 1")
      .Attr("num_source_replicas: int = 1")
      .Attr("first_local_shard: int = 0")
      .Attr("num_local_shards: int = -1")
      // Not in TensorFlow's signature: empty keeps its row order (docs/lookup.md#activation-row-order).
      .Attr("feature_rows_per_sc: list(int) = []")
      .SetShapeFn([table_shape](InferenceContext* c) {
        ShapeHandle table;
        TF_RETURN_IF_ERROR(table_shape(c, &table));
        return ActivationShape(c, table);
      });
  op();
}

absl::Status TensorTableShape(InferenceContext* c, ShapeHandle* table) {
  return c->WithRank(c->input(4), 2, table);
}

absl::Status ResourceTableShape(InferenceContext* c, ShapeHandle* table) {
  *table = c->UnknownShapeOfRank(2);
  auto* handle_data = c->input_handle_shapes_and_types(4);
  if (handle_data != nullptr && handle_data->size() == 1) {
    return c->WithRank((*handle_data)[0].shape, 2, table);
  }
  return absl::OkStatus();
}

const bool kRegistered = [] {
  RegisterLookupOp("SceXlaSparseDenseMatmulWithCsrInput", "float32", TensorTableShape);
  RegisterLookupOp("SceResourceSparseDenseMatmulWithCsrInput", "resource", ResourceTableShape);
  return true;
}();

}  // namespace
}  // namespace tensorflow
