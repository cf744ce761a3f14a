// Kernel of SceMarkTouchedRows (cc/ops/touched_rows_ops.cc): validates the CSR view as the fused
// update does, then sets the flags of the rows it references in the locked flags variable.
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/touched_rows.h"
#include "cc/kernels/kernel_utils.h"
#include "cc/kernels/status_to_tf.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

constexpr int kMinibatchesInput = 4;
constexpr int kActivationRowsInput = 5;
constexpr int kFlagsInput = 6;

class MarkTouchedRowsOp : public OpKernel {
 public:
  explicit MarkTouchedRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string where = absl::StrCat("table '", attrs_.table_name, "'");
    const Tensor& activation_rows = ctx->input(kActivationRowsInput);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(activation_rows.shape()),
                absl::InvalidArgumentError(absl::StrCat(where, ": activation_rows must be a "
                                                        "scalar")));
    LockedVariables locked;
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, {kFlagsInput}, {"flags"}, attrs_.table_name,
                                    /*exclusive=*/true));
    Tensor* flags = locked.tensor(0);
    OP_REQUIRES(ctx, flags->dtype() == DT_UINT8 && flags->dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(
                    where, ": the touched-row flags must be a uint8 vector, got ",
                    DataTypeString(flags->dtype()), " ", flags->shape().DebugString())));
    sce::CsrView view;
    OP_REQUIRES_OK(ctx, MakeCsrView(ctx, attrs_, kMinibatchesInput,
                                    activation_rows.scalar<int64_t>()(), flags->dim_size(0),
                                    &view));
    OP_REQUIRES_OK(ctx, locked.MakeExclusive(ctx));
    flags = locked.tensor(0);
    uint8_t* data = reinterpret_cast<uint8_t*>(const_cast<char*>(flags->tensor_data().data()));
    OP_REQUIRES_OK(ctx, ToTf(sce::MarkTouchedRows(view, data, flags->dim_size(0))));
  }

 private:
  CsrAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("SceMarkTouchedRows").Device(DEVICE_CPU), MarkTouchedRowsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
