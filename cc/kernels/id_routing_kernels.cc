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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rows_per_sparse_core", &rows_per_sparse_core_));
    where_ = "SceRouteIdsToOwners, table '" + table + "'";
    // The attributes alone (no ids) are checked once, here.
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdRouting(params_, nullptr, 0, where_)));
    sce::IdSampleRows no_rows;
    no_rows.rows_per_sparse_core = rows_per_sparse_core_;
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdSampleRows(params_, no_rows, 0, where_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    OP_REQUIRES(ctx, ids.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat(where_, ": ids must be a vector, got ",
                                                        ids.shape().DebugString())));
    const int32_t* data = ids.flat<int32_t>().data();
    const int64_t n = ids.NumElements();
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdRouting(params_, data, n, where_)));
    sce::IdSampleRows rows;
    rows.rows_per_sparse_core = rows_per_sparse_core_;
    if (rows_per_sparse_core_ > 0) {  // otherwise row_ids is not read (any shape)
      const Tensor& row_ids = ctx->input(1);
      OP_REQUIRES(ctx, row_ids.dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": row_ids must be a vector, got ", row_ids.shape().DebugString())));
      rows.row_ids = row_ids.flat<int32_t>().data();
      rows.num_row_ids = row_ids.NumElements();
    }
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateIdSampleRows(params_, rows, n, where_)));
    sce::IdRoute route;
    sce::RouteIds(params_, data, n, rows, &route);
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, route.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, route.counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, route.positions));
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 3, route.max_ids));
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 4, route.max_unique_ids));
  }

 private:
  sce::IdRoutingParams params_;
  int64_t rows_per_sparse_core_ = 0;
  std::string where_;
};

REGISTER_KERNEL_BUILDER(Name("SceRouteIdsToOwners").Device(DEVICE_CPU), RouteIdsToOwnersOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
