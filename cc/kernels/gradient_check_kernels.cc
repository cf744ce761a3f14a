// Kernel of SceRequireFiniteGradients: a thin adapter over sce::RequireFiniteFeatureGradients.
#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/fused_update.h"  // AllFinite
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

class NonFiniteFlagsOp : public OpKernel {
 public:
  explicit NonFiniteFlagsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList values;
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    Tensor* flags = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({values.size()}), &flags));
    auto out = flags->flat<int32_t>();
    int64_t largest = 1;
    for (int i = 0; i < values.size(); ++i) largest = std::max(largest, values[i].NumElements());
    ThreadPoolFor(ctx)(values.size(), largest, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const Tensor& v = values[static_cast<int>(i)];
        out(i) = sce::AllFinite(v.flat<float>().data(), v.NumElements()) ? 0 : 1;
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("SceNonFiniteFlags").Device(DEVICE_CPU), NonFiniteFlagsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
