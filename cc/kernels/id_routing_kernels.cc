// Kernel of SceRouteIdsToOwners: a thin adapter over sce::RouteIds.
#include <string>

#include "cc/core/id_routing.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class RouteIdsToOwnersOp : public OpKernel {
 public:
  explicit RouteIdsToOwnersOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string table;
    OP_REQUIRES_OK(ctx, GetShardGridAttrs(ctx, &params_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table));
    where_ = "SceRouteIdsToOwners, table '" + table + "'";
    // The attributes alone (no ids) are checked once, here.
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdRouting(params_, nullptr, 0, where_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(where_, ": ids must be a vector, got ",
                                                        ids.shape().DebugString())));
    const int32_t* data = ids.flat<int32_t>().data();
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdRouting(params_, data, ids.NumElements(), where_)));
    sce::IdRoute route;
    sce::RouteIds(params_, data, ids.NumElements(), &route);
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, route.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, route.counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, route.positions));
  }

 private:
  sce::IdRoutingParams params_;
  std::string where_;
};

REGISTER_KERNEL_BUILDER(Name("SceRouteIdsToOwners").Device(DEVICE_CPU), RouteIdsToOwnersOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
