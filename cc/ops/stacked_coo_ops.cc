// Registration of SceConvertFeaturesToStackedCooTensor: the COO conversion of all features of one
// stacked table in one op (cc/core/stacked_coo.h). Not a TensorFlow op; TPUEmbeddingV2 uses it
// in place of one SceConvertToListOfSparseCoreCooTensors per feature plus a concatenation.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

REGISTER_OP("SceConvertFeaturesToStackedCooTensor")
    .Input("indices_or_row_splits: N * int32")
    .Input("values: N * int32")
    .Input("weights: N * float32")
    .Output("row_ids: int32")
    .Output("col_ids: int32")
    .Output("gains: float32")
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
    .Attr("stacked_table_sample_count: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
