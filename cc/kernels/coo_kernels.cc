// Kernels of SceConvertToCooTensor and SceConvertToListOfSparseCoreCooTensors: thin adapters
// around sce::ConvertToCoo / sce::ConvertToListOfCoo.
#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/coo.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

// Attributes common to both ConvertTo* ops.
struct CooAttrs {
  int64_t sample_count;
  sce::Combiner combiner;
  int64_t vocabulary_size;
  sce::Context context;
  absl::Status Read(OpKernelConstruction* ctx) {
    std::string combiner_name;
    TF_RETURN_IF_ERROR(ctx->GetAttr("sample_count", &sample_count));
    TF_RETURN_IF_ERROR(ctx->GetAttr("combiner", &combiner_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("vocabulary_size", &vocabulary_size));
    TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &context.table));
    TF_RETURN_IF_ERROR(ctx->GetAttr("feature_name", &context.feature));
    return ToTf(sce::ParseCombiner(combiner_name, &combiner));
  }
};

class ConvertToCooTensorOp : public OpKernel {
 public:
  explicit ConvertToCooTensorOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    sce::CooEntries coo;
    OP_REQUIRES_OK(ctx, ToTf(sce::ConvertToCoo(
                            IdInputFromTensors(ctx->input(0), ctx->input(1), ctx->input(2)),
                            attrs_.sample_count, attrs_.combiner, attrs_.vocabulary_size,
                            attrs_.context, &coo)));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, coo.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, coo.cols));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, coo.gains));
  }

 private:
  CooAttrs attrs_;
};

class ConvertToListOfCooTensorsOp : public OpKernel {
 public:
  explicit ConvertToListOfCooTensorsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_per_chip", &transform_.num_sc_per_chip));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_offset", &transform_.row_offset));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_offset", &transform_.col_offset));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_shift", &transform_.col_shift));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_shards", &transform_.num_sc_shards));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stacked_table_sample_count",
                                     &transform_.stacked_table_sample_count));
    OP_REQUIRES(ctx, transform_.num_sc_per_chip <= sce::kMaxSparseCoresPerChip,
                absl::InvalidArgumentError(absl::StrCat(
                    attrs_.context.Describe(), ": num_sc_per_chip must be in [1, ",
                    sce::kMaxSparseCoresPerChip, "], got ", transform_.num_sc_per_chip)));
    OP_REQUIRES(ctx, sce::IsPowerOfTwo(transform_.num_sc_shards),
                absl::InvalidArgumentError(absl::StrCat(
                    attrs_.context.Describe(), ": num_sc_shards must be a power of two, got ",
                    transform_.num_sc_shards)));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<sce::CooEntries> per_sc;
    OP_REQUIRES_OK(ctx, ToTf(sce::ConvertToListOfCoo(
                            IdInputFromTensors(ctx->input(0), ctx->input(1), ctx->input(2)),
                            attrs_.sample_count, attrs_.combiner, transform_,
                            attrs_.vocabulary_size, attrs_.context, &per_sc)));
    const int num_sc = static_cast<int>(per_sc.size());
    for (int i = 0; i < num_sc; ++i) {
      OP_REQUIRES_OK(ctx, OutputVector(ctx, i, per_sc[i].rows));
      OP_REQUIRES_OK(ctx, OutputVector(ctx, num_sc + i, per_sc[i].cols));
      OP_REQUIRES_OK(ctx, OutputVector(ctx, 2 * num_sc + i, per_sc[i].gains));
    }
  }

 private:
  CooAttrs attrs_;
  sce::StackingTransform transform_;
};

REGISTER_KERNEL_BUILDER(Name("SceConvertToCooTensor").Device(DEVICE_CPU), ConvertToCooTensorOp);
REGISTER_KERNEL_BUILDER(Name("SceConvertToListOfSparseCoreCooTensors").Device(DEVICE_CPU),
                        ConvertToListOfCooTensorsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
