// Registrations of the host preprocessing ops (spec §4-§10). Op names carry the "Sce" prefix
// because TensorFlow already registers kernel-less ops under the plain names; the Python wrappers
// in tf_sc_embedding/ops use TensorFlow's function and argument names.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

// Attributes that every op accepts so error messages can name the table and feature.
constexpr char kTableNameAttr[] = "table_name: string = ''";
constexpr char kFeatureNameAttr[] = "feature_name: string = ''";

absl::Status ThreeVectors(InferenceContext* c) {
  for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

REGISTER_OP("SceConvertToCooTensor")
    .Input("indices_or_row_splits: int32")
    .Input("values: int32")
    .Input("weights: float32")
    .Output("row_ids: int32")
    .Output("col_ids: int32")
    .Output("gains: float32")
    .Attr("sample_count: int >= 1")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .Attr("vocabulary_size: int = -1")
    .Attr(kTableNameAttr)
    .Attr(kFeatureNameAttr)
    .SetShapeFn(ThreeVectors);

REGISTER_OP("SceConvertToListOfSparseCoreCooTensors")
    .Input("indices_or_row_splits: int32")
    .Input("values: int32")
    .Input("weights: float32")
    .Output("row_ids_list: num_sc_per_chip * int32")
    .Output("col_ids_list: num_sc_per_chip * int32")
    .Output("gains_list: num_sc_per_chip * float32")
    .Attr("sample_count: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("row_offset: int >= 0")
    .Attr("col_offset: int >= 0")
    .Attr("col_shift: int >= 0")
    .Attr("num_sc_shards: int >= 1")
    .Attr("stacked_table_sample_count: int >= 1")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'}")
    .Attr("vocabulary_size: int = -1")
    .Attr(kTableNameAttr)
    .Attr(kFeatureNameAttr)
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      return absl::OkStatus();
    });

REGISTER_OP("SceSortListOfSparseCoreCooTensors")
    .Input("row_ids_list: N * int32")
    .Input("col_ids_list: N * int32")
    .Input("gains_list: N * float32")
    .Output("sorted_row_ids: int32")
    .Output("sorted_col_ids: int32")
    .Output("sorted_gains: float32")
    .Output("id_counts: int32")
    .Attr("sample_count_list: list(int)")
    .Attr("col_offset_list: list(int)")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("max_ids_per_sparse_core: int >= 1")
    .Attr("max_unique_ids_per_sparse_core: int >= 1")
    .Attr("table_name: string")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ThreeVectors(c));
      int64_t replicas, cores;
      TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
      TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
      c->set_output(3, c->Vector(replicas * cores + 1));
      return absl::OkStatus();
    });

REGISTER_OP("SceGetStatsFromListOfSparseCoreCooTensors")
    .Input("row_ids_list: N * int32")
    .Input("col_ids_list: N * int32")
    .Input("gains_list: N * float32")
    .Output("max_ids_per_sparse_core: int32")
    .Output("max_unique_ids_per_sparse_core: int32")
    .Attr("sample_count_list: list(int)")
    .Attr("col_offset_list: list(int)")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    });

absl::Status CsrShapes(InferenceContext* c, int64_t row_pointers, int64_t ids) {
  c->set_output(0, c->Vector(row_pointers));
  for (int i = 1; i < 4; ++i) c->set_output(i, c->Vector(ids));
  for (int i = 4; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
  return absl::OkStatus();
}

int64_t RoundUpTo8(int64_t x) { return (x + 7) / 8 * 8; }

REGISTER_OP("SceConvertToSparseCoreCsrWrappedCooTensor")
    .Input("sorted_row_ids_list: num_sc_per_chip * int32")
    .Input("sorted_col_ids_list: num_sc_per_chip * int32")
    .Input("sorted_gains_list: num_sc_per_chip * float32")
    .Input("id_counts_list: num_sc_per_chip * int32")
    .Input("splits: int64")
    .Output("row_pointers: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_token_ids: int32")
    .Output("sorted_gains: float32")
    .Output("row_pointers_unpadded_size: int32")
    .Output("ids_unpadded_size: int32")
    .Output("num_minibatches_per_sc: int32")
    .Output("num_dropped_ids: int32")
    .Attr("sample_count_per_sc: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("max_minibatches_per_sc: int >= 1")
    .Attr("max_ids_per_chip_per_sample: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("allow_id_dropping: bool")
    .Attr("max_division_level: int = 6")
    .Attr("trim_to_size: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int64_t per_sc, replicas, minibatches, per_sample, cores;
      TF_RETURN_IF_ERROR(c->GetAttr("sample_count_per_sc", &per_sc));
      TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
      TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &minibatches));
      TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
      TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
      bool trim;
      TF_RETURN_IF_ERROR(c->GetAttr("trim_to_size", &trim));
      if (trim) return CsrShapes(c, InferenceContext::kUnknownDim, InferenceContext::kUnknownDim);
      return CsrShapes(c, minibatches * cores * RoundUpTo8(replicas * cores),
                       per_sample * per_sc * cores);
    });

REGISTER_OP("SceGetMinibatchSplitsWithPhysicalReplica")
    .Input("program_key: string")
    .Input("row_ids: int32")
    .Input("col_ids: int32")
    .Input("gains: float32")
    .Output("sorted_row_ids: int32")
    .Output("sorted_col_ids: int32")
    .Output("sorted_gains: float32")
    .Output("splits: int64")
    .Output("id_counts: int32")
    .Output("max_ids: int32")
    .Output("max_uniques: int32")
    .Attr("sample_count: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("mini_batch_splits: string")
    .Attr("max_ids_per_partition: int >= 1")
    .Attr("max_unique_ids_per_partition: int >= 1")
    .Attr("max_division_level: int = 6")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ThreeVectors(c));
      int64_t replicas, cores, level;
      TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
      TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
      TF_RETURN_IF_ERROR(c->GetAttr("max_division_level", &level));
      c->set_output(3, c->Scalar());
      if (level >= 0 && level <= 6) {
        c->set_output(4, c->Vector(cores * cores * replicas * (int64_t{1} << level) + 1));
      } else {
        c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
      }
      c->set_output(5, c->Scalar());
      c->set_output(6, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("SceGetMinibatchesInCsrWithPhysicalReplica")
    .Input("program_key: string")
    .Input("row_ids: int32")
    .Input("col_ids: int32")
    .Input("gains: float32")
    .Input("splits: int64")
    .Input("id_counts: int32")
    .Output("row_pointers: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_token_ids: int32")
    .Output("sorted_gains: float32")
    .Output("row_pointers_unpadded_size: int32")
    .Output("ids_unpadded_size: int32")
    .Output("num_minibatches_per_physical_sparse_core: int32")
    .Output("num_dropped_ids: int32")
    .Attr("sample_count: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("max_minibatches_per_sc: int >= 1")
    .Attr("max_ids_per_chip_per_sample: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("mini_batch_in_csr: string")
    .Attr("allow_id_dropping: bool = false")
    .Attr("max_division_level: int = 6")
    .Attr("trim_to_size: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int64_t samples, replicas, minibatches, per_sample, cores;
      TF_RETURN_IF_ERROR(c->GetAttr("sample_count", &samples));
      TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
      TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &minibatches));
      TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
      TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
      bool trim;
      TF_RETURN_IF_ERROR(c->GetAttr("trim_to_size", &trim));
      if (trim) return CsrShapes(c, InferenceContext::kUnknownDim, InferenceContext::kUnknownDim);
      return CsrShapes(c, minibatches * cores * RoundUpTo8(replicas * cores), per_sample * samples);
    });

}  // namespace
}  // namespace tensorflow
