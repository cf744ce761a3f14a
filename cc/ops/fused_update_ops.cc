// Registrations of the fused backward + optimizer ops (docs/optimizers.md#fused-backward-pass), generated from the optimizer
// definitions in cc/core/optimizers.h: a functional form with TensorFlow's signature that returns
// updated copies, and a resource form that updates the table and slot variables in place.
#include <string>

#include "cc/core/optimizers.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

// The functional form keeps TensorFlow's signature. The resource form (ours) also takes the
// gradients in the lookup's feature-major order (docs/optimizers.md#gradient-order): one tensor,
// or one per feature (N of them) so that the embedding needs no concatenation of its features'
// gradients. feature_rows_per_sc is the lookup's attribute of the same name.
template <typename Optimizer>
void AddCommon(register_op::OpDefBuilderWrapper& op, bool resource) {
  const char* table_type = resource ? "resource" : "float32";
  op.Input("row_pointers: int32")
      .Input("sorted_sample_ids: int32")
      .Input("sorted_token_ids: int32")
      .Input("sorted_gains: float32")
      .Input(resource ? "activation_gradients: N * float32" : "activation_gradients: float32")
      .Input("learning_rate: float32")
      .Input(std::string("embedding_table: ") + table_type);
  if (resource) op.Attr("N: int >= 1").Attr("feature_rows_per_sc: list(int) = []");
  for (const char* slot : Optimizer::kSlots) op.Input(std::string(slot) + ": " + table_type);
  op.Input("num_minibatches_per_physical_sparse_core: int32");
  // 16-bit tables (resource form only): the step whose bits round the rows written back, and the
  // member tables' layout and seeds that give each row its logical id (row_precision.h).
  if (resource) {
    // touched (delta tracking, cc/core/touched_rows.h): none, or one uint8 [table rows] variable
    // in which the update marks every row it writes.
    op.Input("rounding_step: int64")
        .Input("touched: num_touched * resource")
        .Attr("num_touched: int >= 0 = 0")
        .Attr("rounding_seeds: list(int) = []")
        .Attr("rounding_row_offsets: list(int) = []")
        .Attr("rounding_rotations: list(int) = []")
        .Attr("rounding: {'stochastic', 'nearest'} = 'stochastic'");
  }
  for (const sce::HyperSpec& h : Optimizer::kHypers) {
    op.Attr(std::string(h.name) + (h.type == sce::HyperType::kBool       ? ": bool"
                                   : h.type == sce::HyperType::kRowWidth ? ": int"
                                                                         : ": float"));
  }
  op.Attr("table_name: string")
      .Attr("clip_weight_min: float = -inf")
      .Attr("clip_weight_max: float = inf")
      .Attr("num_sparsecores_per_device: int = -1")
      .Attr("num_replica: int = 1")
      .Attr("num_source_replicas: int = 1")
      .Attr("first_local_shard: int = 0")
      .Attr("num_local_shards: int = -1")
      .Attr("non_finite_gradients: {'error', 'skip'} = 'error'");
}

struct RegisterFusedOps {
  template <typename Optimizer>
  void operator()() const {
    const std::string suffix = std::string(Optimizer::kOpName) + "AndCsrInput";
    {
      const std::string name = "SceXlaSparseDenseMatmulGradWith" + suffix;
      register_op::OpDefBuilderWrapper op(name.c_str());
      AddCommon<Optimizer>(op, /*resource=*/false);
      op.Output("updated_embedding_table: float32");
      for (const char* slot : Optimizer::kSlots) {
        op.Output(std::string("updated_") + slot + ": float32");
      }
      op.Output("num_skipped_rows: int32");
      op.SetShapeFn([](InferenceContext* c) {
        for (int i = 0; i + 1 < c->num_outputs(); ++i) c->set_output(i, c->input(6 + i));
        c->set_output(c->num_outputs() - 1, c->Scalar());
        return absl::OkStatus();
      });
      op();
    }
    {
      const std::string name = "SceResourceSparseDenseMatmulGradWith" + suffix;
      register_op::OpDefBuilderWrapper op(name.c_str());
      AddCommon<Optimizer>(op, /*resource=*/true);
      op.Output("num_skipped_rows: int32");
      op.SetShapeFn([](InferenceContext* c) {
        c->set_output(0, c->Scalar());
        return absl::OkStatus();
      });
      op();
    }
  }
};

const bool kRegistered = [] {
  sce::ForEachOptimizer(RegisterFusedOps());
  return true;
}();

}  // namespace
}  // namespace tensorflow
