// Registrations of the ops that take all features of one stacked table (not TensorFlow ops):
// SceConvertFeaturesToStackedCooTensor, the COO conversion of all features in one op
// (cc/core/stacked_coo.h), in place of one SceConvertToListOfSparseCoreCooTensors per feature plus
// a concatenation; and SceConvertFeaturesToMinibatchSplits, that conversion followed by
// SceGetMinibatchSplitsWithPhysicalReplica in one op (cc/core/stacked_splits.h), which
// TPUEmbeddingV2 uses when it needs no per-feature lists.
#include <string>

#include "cc/ops/minibatch_splits_signature.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

// The inputs and attributes both ops share: the ragged ids of every feature of one stacked table
// and where each feature goes in it (tf_sc_embedding/ops/preprocessing.py builds them).
void AddStackedFeatures(register_op::OpDefBuilderWrapper& op) {
  op.Input("indices_or_row_splits: N * int32")
      .Input("values: N * int32")
      .Input("weights: N * float32")
      .Attr("N: int >= 1")
      .Attr("sample_counts: list(int)")
      .Attr("row_offsets: list(int)")
      .Attr("col_offsets: list(int)")
      .Attr("col_shifts: list(int)")
      .Attr("vocabulary_sizes: list(int)")
      .Attr("combiners: list(string)")
      .Attr("table_names: list(string)")
      .Attr("feature_names: list(string)")
      .Attr("num_sc_per_chip: int >= 1")
      .Attr("num_sc_shards: int >= 1")
      .Attr("stacked_table_sample_count: int >= 1");
}

absl::Status StackedCooShape(InferenceContext* c) {
  for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

const bool kRegistered = [] {
  {
    register_op::OpDefBuilderWrapper op("SceConvertFeaturesToStackedCooTensor");
    AddStackedFeatures(op);
    op.Output("row_ids: int32")
        .Output("col_ids: int32")
        .Output("gains: float32")
        .SetShapeFn(StackedCooShape);
    op();
  }
  {
    register_op::OpDefBuilderWrapper op("SceConvertFeaturesToMinibatchSplits");
    AddStackedFeatures(op);
    sce_ops::AddMinibatchSplitsOutputs(op);
    op.Attr("num_replica: int >= 1")
        .Attr("table_vocab_size: int >= 1")
        .Attr("table_name: string")
        .Attr("max_ids_per_partition: int >= 1")
        .Attr("max_unique_ids_per_partition: int >= 1")
        .Attr(sce_ops::MaxDivisionLevelAttr())
        .SetShapeFn(sce_ops::MinibatchSplitsShape);
    op();
  }
  return true;
}();

}  // namespace
}  // namespace tensorflow
