// Kernel of SceRequireFiniteGradients: a thin adapter over sce::RequireFiniteFeatureGradients.
#include <string>
#include <vector>

#include "cc/core/gradient_check.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class RequireFiniteGradientsOp : public OpKernel {
 public:
  explicit RequireFiniteGradientsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_names", &feature_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& flags = ctx->input(0);
    OP_REQUIRES(ctx, flags.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "non_finite must be a vector with one entry per feature, got rank ",
                    flags.dims())));
    OP_REQUIRES_OK(ctx, ToTf(sce::RequireFiniteFeatureGradients(
                            flags.flat<int32_t>().data(), flags.NumElements(), feature_names_,
                            table_names_)));
    for (int i = 1; i < ctx->num_inputs(); ++i) ctx->set_output(i - 1, ctx->input(i));
  }

 private:
  std::vector<std::string> feature_names_;
  std::vector<std::string> table_names_;
};

REGISTER_KERNEL_BUILDER(Name("SceRequireFiniteGradients").Device(DEVICE_CPU),
                        RequireFiniteGradientsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
