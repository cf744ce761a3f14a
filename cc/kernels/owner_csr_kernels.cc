// Kernel of SceOwnerCsr: a thin adapter over sce::BuildOwnerCsr.
#include <string>

#include "cc/core/owner_csr.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class OwnerCsrOp : public OpKernel {
 public:
  explicit OwnerCsrOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string table;
    OP_REQUIRES_OK(ctx, GetShardGridAttrs(ctx, &params_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("replica_id", &params_.replica_id));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table));
    where_ = "SceOwnerCsr, table '" + table + "'";
    sce::OwnerCsrSizes sizes;
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateOwnerCsr(params_, nullptr, 0, where_, &sizes)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    OP_REQUIRES(ctx, rows.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(where_, ": rows must be a vector, got ",
                                                        rows.shape().DebugString())));
    const int64_t n = rows.NumElements();
    const int32_t* data = rows.flat<int32_t>().data();
    sce::OwnerCsrSizes sizes;
    // Every row and size is checked before anything is allocated.
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateOwnerCsr(params_, data, n, where_, &sizes)));
    Tensor *pointers, *samples, *tokens, *gains;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({sizes.row_pointers}), &pointers));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({sizes.entries}), &samples));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({sizes.entries}), &tokens));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({sizes.entries}), &gains));
    sce::BuildOwnerCsr(params_, data, n, sizes, pointers->flat<int32_t>().data(),
                       samples->flat<int32_t>().data(), tokens->flat<int32_t>().data(),
                       gains->flat<float>().data());
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 4, sizes.activation_rows));
  }

 private:
  sce::OwnerCsrParams params_;
  std::string where_;
};

REGISTER_KERNEL_BUILDER(Name("SceOwnerCsr").Device(DEVICE_CPU), OwnerCsrOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
