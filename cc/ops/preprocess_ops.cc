// Registrations of the host preprocessing ops (docs/preprocessing.md#host-preprocessing). Op names carry the "Sce" prefix
// because TensorFlow already registers kernel-less ops under the plain names; the Python wrappers
// in tf_sc_embedding/ops use TensorFlow's function and argument names.
#include <string>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/csr.h"
#include "cc/core/minibatch_splits.h"
#include "cc/core/split_encoding.h"
#include "cc/ops/minibatch_splits_signature.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;

// Attributes that every op accepts so error messages can name the table and feature.
constexpr char kTableNameAttr[] = "table_name: string = ''";
constexpr char kFeatureNameAttr[] = "feature_name: string = ''";
const std::string kMaxDivisionLevelAttr = sce_ops::MaxDivisionLevelAttr();

// Shape functions see the raw attributes: every size they form is overflow-checked and bounded
// (sce/checked_math.h), and an impossible value is an InvalidArgument instead of a negative or
// wrapped-around dimension that would make TensorShape abort the process later.
std::string TableOf(InferenceContext* c) {
  std::string table;
  if (!c->GetAttr("table_name", &table).ok()) table.clear();
  return "table '" + table + "'";
}

absl::Status CheckedDim(InferenceContext* c, const char* op, const char* what,
                        std::initializer_list<int64_t> factors, int64_t add, int64_t max_value,
                        int64_t* out) {
  int64_t product;
  if (!sce::CheckedProduct(factors, &product) || !sce::CheckedAdd(product, add, out) ||
      *out > max_value) {
    std::string values;
    for (int64_t f : factors) values += (values.empty() ? "" : " * ") + std::to_string(f);
    return absl::InvalidArgumentError(absl::StrCat(TableOf(c), " (", op, "): ", what, " (", values,
                                                   add ? absl::StrCat(" + ", add) : "",
                                                   ") exceeds the limit of ", max_value));
  }
  return absl::OkStatus();
}

absl::Status AttrInRange(InferenceContext* c, const char* name, int64_t max_value,
                         int64_t* value) {
  TF_RETURN_IF_ERROR(c->GetAttr(name, value));
  if (*value > max_value) {
    return absl::InvalidArgumentError(absl::StrCat(TableOf(c), ": ", name, " must be at most ",
                                                   max_value, ", got ", *value));
  }
  return absl::OkStatus();
}

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
      int64_t cores;
      TF_RETURN_IF_ERROR(AttrInRange(c, "num_sc_per_chip", sce::kMaxSparseCoresPerChip, &cores));
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
      int64_t replicas, cores, counts;
      TF_RETURN_IF_ERROR(AttrInRange(c, "num_replica", sce::kMaxReplicas, &replicas));
      TF_RETURN_IF_ERROR(AttrInRange(c, "num_sc_per_chip", sce::kMaxSparseCoresPerChip, &cores));
      TF_RETURN_IF_ERROR(CheckedDim(c, "SortListOfSparseCoreCooTensors",
                                    "id_counts size num_replica * num_sc_per_chip + 1",
                                    {replicas, cores}, 1, sce::kMaxShards + 1, &counts));
      c->set_output(3, c->Vector(counts));
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

absl::Status FromCore(const sce::Status& status) {
  return status.ok() ? absl::OkStatus() : absl::InvalidArgumentError(status.message());
}

// Output shapes of both CSR-building ops: unknown with trim_to_size, else the static buffer sizes
// (docs/preprocessing.md#csr-wrapped-coo-buffers, docs/preprocessing.md#csr-buffers-with-minibatches)
// from the core's size functions (cc/core/csr.h), every product checked.
// `id_buffer_size(where, max_ids_per_chip_per_sample, num_sc_per_chip, max_value, &ids)` is the
// core function for the op's id capacity.
template <typename IdBufferSizeFn>
absl::Status CsrOutputShapes(InferenceContext* c, const char* op, IdBufferSizeFn id_buffer_size) {
  bool trim;
  TF_RETURN_IF_ERROR(c->GetAttr("trim_to_size", &trim));
  if (trim) return CsrShapes(c, InferenceContext::kUnknownDim, InferenceContext::kUnknownDim);
  int64_t replicas, minibatches, per_sample, cores;
  TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
  TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &minibatches));
  TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
  TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
  const std::string where = absl::StrCat(TableOf(c), " (", op, ")");
  int64_t row_pointers, ids;
  TF_RETURN_IF_ERROR(FromCore(sce::CsrRowPointerBufferSize(
      where, replicas, cores, minibatches, sce::kMaxAllocationElements, &row_pointers)));
  TF_RETURN_IF_ERROR(FromCore(
      id_buffer_size(where, per_sample, cores, sce::kMaxAllocationElements, &ids)));
  return CsrShapes(c, row_pointers, ids);
}

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
    .Attr(kMaxDivisionLevelAttr)
    .Attr("trim_to_size: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int64_t per_sc;
      TF_RETURN_IF_ERROR(c->GetAttr("sample_count_per_sc", &per_sc));
      return CsrOutputShapes(
          c, "ConvertToSparseCoreCsrWrappedCooTensor",
          [per_sc](const std::string& where, int64_t per_sample, int64_t cores, int64_t max_value,
                   int64_t* ids) {
            return sce::WrappedCooIdBufferSize(where, per_sample, per_sc, cores, max_value, ids);
          });
    });

const bool kMinibatchSplitsRegistered = [] {
  register_op::OpDefBuilderWrapper op("SceGetMinibatchSplitsWithPhysicalReplica");
  op.Input("program_key: string")
      .Input("row_ids: int32")
      .Input("col_ids: int32")
      .Input("gains: float32");
  sce_ops::AddMinibatchSplitsOutputs(op);
  op.Attr("sample_count: int >= 1")
      .Attr("num_replica: int >= 1")
      .Attr("table_vocab_size: int >= 1")
      .Attr("feature_width: int >= 1")
      .Attr("num_sc_per_chip: int >= 1")
      .Attr("table_name: string")
      .Attr("mini_batch_splits: string")
      .Attr("max_ids_per_partition: int >= 1")
      .Attr("max_unique_ids_per_partition: int >= 1")
      .Attr(kMaxDivisionLevelAttr)
      .SetShapeFn(sce_ops::MinibatchSplitsShape);
  op();
  return true;
}();

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
    .Attr(kMaxDivisionLevelAttr)
    .Attr("trim_to_size: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      int64_t samples;
      TF_RETURN_IF_ERROR(c->GetAttr("sample_count", &samples));
      return CsrOutputShapes(
          c, "GetMinibatchesInCsrWithPhysicalReplica",
          [samples](const std::string& where, int64_t per_sample, int64_t /*cores*/,
                    int64_t max_value, int64_t* ids) {
            return sce::MinibatchCsrIdBufferSize(where, per_sample, samples, max_value, ids);
          });
    });

}  // namespace
}  // namespace tensorflow
