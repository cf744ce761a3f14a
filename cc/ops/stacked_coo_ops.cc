// Registrations of the ops that take all features of one stacked table (not TensorFlow ops):
// SceConvertFeaturesToStackedCooTensor, the COO conversion of all features in one op
// (cc/core/stacked_coo.h), in place of one SceConvertToListOfSparseCoreCooTensors per feature plus
// a concatenation; and SceConvertFeaturesToMinibatchSplits, that conversion followed by
// SceGetMinibatchSplitsWithPhysicalReplica in one op (cc/core/stacked_splits.h), which
// TPUEmbeddingV2 uses when it needs no per-feature lists.
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/constants.h"
#include "cc/core/minibatch_splits.h"
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

REGISTER_OP("SceConvertFeaturesToMinibatchSplits")
    .Input("indices_or_row_splits: N * int32")
    .Input("values: N * int32")
    .Input("weights: N * float32")
    .Output("sorted_row_ids: int32")
    .Output("sorted_col_ids: int32")
    .Output("sorted_gains: float32")
    .Output("splits: int64")
    .Output("id_counts: int32")
    .Output("max_ids: int32")
    .Output("max_uniques: int32")
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
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("table_name: string")
    .Attr("max_ids_per_partition: int >= 1")
    .Attr("max_unique_ids_per_partition: int >= 1")
    .Attr(absl::StrCat("max_division_level: int = ", sce::kDefaultMaxDivisionLevel))
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      int64_t replicas, cores, level, counts;
      std::string table;
      TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
      TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
      TF_RETURN_IF_ERROR(c->GetAttr("max_division_level", &level));
      TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
      c->set_output(3, c->Scalar());
      if (sce::MinibatchIdCountsSize("table '" + table + "'", replicas, cores, level, &counts)
              .ok()) {
        c->set_output(4, c->Vector(counts));
      } else {  // the kernel reports the impossible attribute with the table name
        c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
      }
      c->set_output(5, c->Scalar());
      c->set_output(6, c->Scalar());
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
