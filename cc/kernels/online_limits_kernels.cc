// Kernel of SceRaiseSparseCoreLimits: a thin adapter over sce::RaisePartitionLimits that updates
// the limits variable in place under its lock and logs each raised limit.
#include <string>
#include <vector>

#include "cc/core/online_limits.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/platform/logging.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class RaiseSparseCoreLimitsOp : public OpKernel {
 public:
  explicit RaiseSparseCoreLimitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& observed = ctx->input(1);
    const int64_t tables = static_cast<int64_t>(table_names_.size());
    const TensorShape expected({tables, sce::kNumPartitionLimits});
    OP_REQUIRES(ctx, observed.dtype() == DT_INT32 && observed.shape() == expected,
                absl::InvalidArgumentError(absl::StrCat(
                    "observed must be int32 of shape ", expected.DebugString(), ", got ",
                    observed.shape().DebugString())));
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    mutex_lock lock(*var->mu());
    const Tensor& current = *var->tensor();
    OP_REQUIRES(ctx, var->is_initialized && current.dtype() == DT_INT32 &&
                         current.shape() == expected,
                absl::InvalidArgumentError(absl::StrCat(
                    "limits must be an initialized int32 variable of shape ",
                    expected.DebugString(), ", got ", current.shape().DebugString())));
    // The raised limits go into a new buffer that replaces the variable's: a reader holding the
    // old buffer never sees it change, and the output can share the new one (it is never
    // written in place).
    Tensor raised;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, expected, &raised));
    raised.flat<int32_t>() = current.flat<int32_t>();
    std::vector<std::string> changes;
    OP_REQUIRES_OK(ctx, ToTf(sce::RaisePartitionLimits(
                            raised.flat<int32_t>().data(), observed.flat<int32_t>().data(),
                            observed.NumElements(), table_names_, &changes)));
    for (const std::string& change : changes) LOG(WARNING) << change;
    *var->tensor() = raised;
    ctx->set_output(0, raised);
  }

 private:
  std::vector<std::string> table_names_;
};

REGISTER_KERNEL_BUILDER(Name("SceRaiseSparseCoreLimits").Device(DEVICE_CPU),
                        RaiseSparseCoreLimitsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
