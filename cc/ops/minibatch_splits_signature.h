// The part of the op signature shared by the ops that end in minibatch splits
// (SceGetMinibatchSplitsWithPhysicalReplica, and SceConvertFeaturesToMinibatchSplits which runs
// the COO conversion first): their seven outputs, their shapes, and the max_division_level
// attribute. Both ops feed the same CSR op, so these must not drift apart.
#ifndef SCE_OPS_MINIBATCH_SPLITS_SIGNATURE_H_
#define SCE_OPS_MINIBATCH_SPLITS_SIGNATURE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/constants.h"
#include "cc/core/minibatch_splits.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sce_ops {

// The default number of minibatch division levels, from the one home of the constant.
inline std::string MaxDivisionLevelAttr() {
  return absl::StrCat("max_division_level: int = ", sce::kDefaultMaxDivisionLevel);
}

inline void AddMinibatchSplitsOutputs(register_op::OpDefBuilderWrapper& op) {
  op.Output("sorted_row_ids: int32")
      .Output("sorted_col_ids: int32")
      .Output("sorted_gains: float32")
      .Output("splits: int64")
      .Output("id_counts: int32")
      .Output("max_ids: int32")
      .Output("max_uniques: int32");
}

// Ids, column ids and gains of unknown length; the splits bitmask and the maxima are scalars;
// id_counts has one entry per (replica, SparseCore, finest division), known from the attributes.
// An impossible attribute leaves that length unknown: the kernel then fails naming the table.
inline absl::Status MinibatchSplitsShape(shape_inference::InferenceContext* c) {
  using shape_inference::InferenceContext;
  for (int i = 0; i < 3; ++i) c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  int64_t replicas, cores, level, counts;
  std::string table;
  TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &replicas));
  TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &cores));
  TF_RETURN_IF_ERROR(c->GetAttr("max_division_level", &level));
  if (!c->GetAttr("table_name", &table).ok()) table.clear();
  c->set_output(3, c->Scalar());
  if (sce::MinibatchIdCountsSize("table '" + table + "'", replicas, cores, level, &counts).ok()) {
    c->set_output(4, c->Vector(counts));
  } else {
    c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
  }
  c->set_output(5, c->Scalar());
  c->set_output(6, c->Scalar());
  return absl::OkStatus();
}

}  // namespace sce_ops
}  // namespace tensorflow

#endif  // SCE_OPS_MINIBATCH_SPLITS_SIGNATURE_H_
