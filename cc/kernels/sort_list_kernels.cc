// Kernels of SceSortListOfSparseCoreCooTensors and SceGetStatsFromListOfSparseCoreCooTensors.
#include "cc/core/sort_list.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class ListOfCooOpBase : public OpKernel {
 public:
  explicit ListOfCooOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_count_list", &sample_counts_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_offset_list", &col_offsets_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_replica", &num_replica_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_per_chip", &num_sc_per_chip_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    int64_t n;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES(ctx,
                static_cast<int64_t>(sample_counts_.size()) == n &&
                    static_cast<int64_t>(col_offsets_.size()) == n,
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", table_name_, "': sample_count_list and col_offset_list must have ",
                    n, " entries (one per feature), got ", sample_counts_.size(), " and ",
                    col_offsets_.size())));
  }

 protected:
  absl::Status Features(OpKernelContext* ctx, std::vector<sce::FeatureCooView>* features) {
    OpInputList rows, cols, gains;
    TF_RETURN_IF_ERROR(ctx->input_list("row_ids_list", &rows));
    TF_RETURN_IF_ERROR(ctx->input_list("col_ids_list", &cols));
    TF_RETURN_IF_ERROR(ctx->input_list("gains_list", &gains));
    for (int f = 0; f < rows.size(); ++f) {
      if (rows[f].dims() != 1 || cols[f].dims() != 1 || gains[f].dims() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", table_name_, "': row, col and gain inputs of feature ", f,
            " must be rank 1"));
      }
      sce::FeatureCooView v;
      v.rows = rows[f].flat<int32_t>().data();
      v.cols = cols[f].flat<int32_t>().data();
      v.gains = gains[f].flat<float>().data();
      v.num_rows = rows[f].NumElements();
      v.num_cols = cols[f].NumElements();
      v.num_gains = gains[f].NumElements();
      v.sample_count = sample_counts_[f];
      v.col_offset = col_offsets_[f];
      features->push_back(v);
    }
    return absl::OkStatus();
  }

  std::vector<int32_t> sample_counts_;
  std::vector<int32_t> col_offsets_;
  int64_t num_replica_;
  int64_t num_sc_per_chip_;
  std::string table_name_;
};

class SortListOfCooTensorsOp : public ListOfCooOpBase {
 public:
  explicit SortListOfCooTensorsOp(OpKernelConstruction* ctx) : ListOfCooOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_ids_per_sparse_core", &max_ids_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_unique_ids_per_sparse_core", &max_uniques_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<sce::FeatureCooView> features;
    OP_REQUIRES_OK(ctx, Features(ctx, &features));
    sce::SortedCoo sorted;
    OP_REQUIRES_OK(ctx, ToTf(sce::SortListOfCoo(features, num_replica_, num_sc_per_chip_, max_ids_,
                                                max_uniques_, table_name_, &sorted)));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, sorted.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, sorted.cols));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, sorted.gains));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, sorted.id_counts));
  }

 private:
  int64_t max_ids_, max_uniques_;
};

class GetStatsFromListOfCooTensorsOp : public ListOfCooOpBase {
 public:
  using ListOfCooOpBase::ListOfCooOpBase;

  void Compute(OpKernelContext* ctx) override {
    std::vector<sce::FeatureCooView> features;
    OP_REQUIRES_OK(ctx, Features(ctx, &features));
    sce::ShardCounts counts;
    OP_REQUIRES_OK(ctx, ToTf(sce::CountIdsPerShard(features, num_replica_, num_sc_per_chip_,
                                                   table_name_, &counts)));
    int64_t max_ids = 0, max_uniques = 0;
    for (size_t p = 0; p < counts.ids.size(); ++p) {
      max_ids = std::max(max_ids, counts.ids[p]);
      max_uniques = std::max(max_uniques, counts.uniques[p]);
    }
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 0, max_ids));
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 1, max_uniques));
  }
};

REGISTER_KERNEL_BUILDER(Name("SceSortListOfSparseCoreCooTensors").Device(DEVICE_CPU),
                        SortListOfCooTensorsOp);
REGISTER_KERNEL_BUILDER(Name("SceGetStatsFromListOfSparseCoreCooTensors").Device(DEVICE_CPU),
                        GetStatsFromListOfCooTensorsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
