// Registration of the forward sparse-dense matmul (docs/lookup.md#forward-lookup), in a tensor form (TensorFlow's
// signature) and a resource form that reads the table variable in place.
#include <string>

#include "cc/core/checked_math.h"
#include "cc/ops/table_shape.h"

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
void RegisterLookupOp(const char* name, bool resource) {
  register_op::OpDefBuilderWrapper op(name);
  op.Input("row_pointers: int32")
      .Input("sorted_sample_ids: int32")
      .Input("sorted_token_ids: int32")
      .Input("sorted_gains: float32")
      .Input(resource ? "embedding_table: resource" : "embedding_table: float32")
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
      .SetShapeFn([resource](InferenceContext* c) {
        ShapeHandle table;
        TF_RETURN_IF_ERROR(sce_ops::TableShape(c, 4, resource, &table));
        return ActivationShape(c, table);
      });
  op();
}

const bool kRegistered = [] {
  RegisterLookupOp("SceXlaSparseDenseMatmulWithCsrInput", /*resource=*/false);
  RegisterLookupOp("SceResourceSparseDenseMatmulWithCsrInput", /*resource=*/true);
  return true;
}();

}  // namespace
}  // namespace tensorflow
