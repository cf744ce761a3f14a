// Kernel of SceGatheredSegmentSum: a thin adapter over sce::GatheredSegmentSum.
#include <string>

#include "cc/core/gathered_segment_sum.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class GatheredSegmentSumOp : public OpKernel {
 public:
  explicit GatheredSegmentSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string table;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table));
    where_ = table.empty() ? std::string("SceGatheredSegmentSum")
                           : "SceGatheredSegmentSum, table '" + table + "'";
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& positions = ctx->input(1);
    const Tensor& gains = ctx->input(2);
    const Tensor& segments = ctx->input(3);
    const Tensor& num_segments = ctx->input(4);
    OP_REQUIRES(ctx, rows.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(where_, ": rows must be rank 2, got ",
                                                        rows.shape().DebugString())));
    const int64_t n = positions.NumElements();
    OP_REQUIRES(ctx, positions.dims() == 1 && gains.dims() == 1 && segments.dims() == 1 &&
                         gains.NumElements() == n && segments.NumElements() == n,
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": positions, gains and segment_ids must be vectors of one length, "
                    "got ", positions.shape().DebugString(), ", ", gains.shape().DebugString(),
                    " and ", segments.shape().DebugString())));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(num_segments.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": num_segments must be a scalar, got ",
                    num_segments.shape().DebugString())));
    sce::GatheredSegmentSumArgs args;
    args.rows = rows.flat<float>().data();
    args.num_rows = rows.dim_size(0);
    args.width = rows.dim_size(1);
    args.positions = positions.flat<int32_t>().data();
    args.gains = gains.flat<float>().data();
    args.segments = segments.flat<int32_t>().data();
    args.num_entries = n;
    args.num_segments = num_segments.scalar<int32_t>()();
    // Every size and index is checked before the output is allocated.
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateGatheredSegmentSum(args, where_)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({args.num_segments, args.width}),
                                             &out));
    sce::GatheredSegmentSum(args, out->flat<float>().data(), ThreadPoolFor(ctx),
                            IntraOpThreads(ctx));
  }

 private:
  std::string where_;
};

REGISTER_KERNEL_BUILDER(Name("SceGatheredSegmentSum").Device(DEVICE_CPU), GatheredSegmentSumOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
