// Kernel of SceRequire (cc/ops/require_ops.cc): fails when any element of the condition is
// false, else forwards its inputs.
#include <string>

#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class RequireOp : public OpKernel {
 public:
  explicit RequireOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("message", &message_));
  }

  void Compute(OpKernelContext* ctx) override {
    const auto condition = ctx->input(0).flat<bool>();
    for (int64_t i = 0; i < condition.size(); ++i) {
      OP_REQUIRES(ctx, condition(i), absl::InvalidArgumentError(message_));
    }
    for (int i = 1; i < ctx->num_inputs(); ++i) ctx->set_output(i - 1, ctx->input(i));
  }

 private:
  std::string message_;
};

REGISTER_KERNEL_BUILDER(Name("SceRequire").Device(DEVICE_CPU), RequireOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
