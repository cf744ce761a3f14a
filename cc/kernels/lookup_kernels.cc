// Kernels of the forward sparse-dense matmul: sce::SparseDenseMatmul over a table given as a
// tensor or read in place from a resource variable (under a shared lock, no copy).
#include "cc/core/checked_math.h"
#include "cc/core/huge_pages.h"
#include "cc/core/lookup.h"
#include "cc/kernels/kernel_utils.h"
#include "cc/kernels/lookup_table.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

template <bool kResource>
class SparseDenseMatmulOp : public OpKernel {
 public:
  explicit SparseDenseMatmulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_size", &input_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_rows_per_sc", &feature_rows_per_sc_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("quantization_config_low", &quantization_.low));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("quantization_config_high", &quantization_.high));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("quantization_config_num_buckets", &quantization_.num_buckets));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateQuantization(quantization_, attrs_.table_name)));
  }

  void Compute(OpKernelContext* ctx) override {
    LockedVariables locked;
    const Tensor* table = &ctx->input(4);
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.Lock(ctx, {4}, {"embedding_table"}, attrs_.table_name,
                                      /*exclusive=*/false));
      table = locked.tensor(0);
    }
    // A variable may hold 16-bit rows (bfloat16 or float16), read as float32.
    OP_REQUIRES_OK(ctx, CheckLookupTable(*table, attrs_.table_name));
    sce::CsrView view;
    OP_REQUIRES_OK(ctx, MakeCsrView(ctx, attrs_, 5, input_size_, table->dim_size(0), &view));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateFeatureRows(feature_rows_per_sc_, view)));
    const int64_t dim = table->dim_size(1);
    // input_size is an attribute: bound the output before allocating it (a TensorShape whose
    // element count overflows would abort the process).
    int64_t elements;
    OP_REQUIRES_OK(ctx, ToTf(sce::CheckedSize("table '" + attrs_.table_name + "'",
                                              "the activations size input_size * dim",
                                              {input_size_, dim}, sce::kMaxAllocationElements,
                                              &elements)));
    Tensor* activations = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({input_size_, dim}), &activations));
    // A table held in a variable is read at random every step: back it with huge pages.
    if (kResource) sce::BackWithHugePages(table->tensor_data().data(), table->TotalBytes());
    float* out = activations->flat<float>().data();
    WithTableRows(*table, [&](const auto* rows) {
      sce::SparseDenseMatmul(view, rows, dim, quantization_, out, ThreadPoolFor(ctx),
                             feature_rows_per_sc_);
    });
  }

 private:
  CsrAttrs attrs_;
  int64_t input_size_;
  sce::Quantization quantization_;
  sce::FeatureRowsPerSc feature_rows_per_sc_;
};

REGISTER_KERNEL_BUILDER(Name("SceXlaSparseDenseMatmulWithCsrInput").Device(DEVICE_CPU),
                        SparseDenseMatmulOp<false>);
REGISTER_KERNEL_BUILDER(Name("SceResourceSparseDenseMatmulWithCsrInput").Device(DEVICE_CPU),
                        SparseDenseMatmulOp<true>);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
