// Kernel of SceAssignRows (cc/ops/assign_rows_ops.cc): checks every row and size, then copies
// the rows into the locked variable's own buffer (given its own copy first if a reader shares it).
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/row_precision.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class AssignRowsOp : public OpKernel {
 public:
  explicit AssignRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const std::string where = absl::StrCat("table '", table_name_, "'");
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(rows.shape()) &&
                         TensorShapeUtils::IsMatrix(values.shape()) &&
                         values.dim_size(0) == rows.dim_size(0),
                errors::InvalidArgument(where, ": SceAssignRows needs rows [k] and values [k, w], "
                                        "got ", rows.shape().DebugString(), " and ",
                                        values.shape().DebugString()));
    LockedVariables locked;
    OP_REQUIRES_OK(ctx, locked.Lock(ctx, {0}, {"embedding_table"}, table_name_,
                                    /*exclusive=*/true));
    Tensor* variable = locked.tensor(0);
    OP_REQUIRES(ctx, variable->dims() == 2,
                errors::InvalidArgument(where, ": the variable must be a matrix, got ",
                                        variable->shape().DebugString()));
    const int64_t height = variable->dim_size(0);
    const int64_t width = variable->dim_size(1);
    const int64_t count = rows.dim_size(0);
    const int64_t columns = values.dim_size(1);
    OP_REQUIRES(ctx, columns <= width,
                errors::InvalidArgument(where, ": values have ", columns,
                                        " columns, the variable only ", width));
    const int32_t* row = rows.flat<int32_t>().data();
    for (int64_t i = 0; i < count; ++i) {
      OP_REQUIRES(ctx, row[i] >= 0 && row[i] < height,
                  errors::InvalidArgument(where, ": row ", row[i], " (entry ", i,
                                          ") is outside the variable's ", height, " rows"));
    }
    if (count == 0 || columns == 0) return;
    OP_REQUIRES_OK(ctx, locked.MakeExclusive(ctx));
    variable = locked.tensor(0);
    const float* source = values.flat<float>().data();
    const DataType dtype = variable->dtype();
    char* base = const_cast<char*>(variable->tensor_data().data());
    for (int64_t i = 0; i < count; ++i) {
      const float* from = source + i * columns;
      if (dtype == DT_FLOAT) {
        std::memcpy(reinterpret_cast<float*>(base) + row[i] * width, from,
                    columns * sizeof(float));
        continue;
      }
      uint16_t* to = reinterpret_cast<uint16_t*>(base) + row[i] * width;
      bool overflow = false;
      for (int64_t j = 0; j < columns; ++j) {
        to[j] = dtype == DT_BFLOAT16 ? sce::FloatToBfloat16Nearest(from[j])
                                     : sce::FloatToFloat16Nearest(from[j], &overflow);
      }
    }
  }

 private:
  std::string table_name_;
};

REGISTER_KERNEL_BUILDER(Name("SceAssignRows").Device(DEVICE_CPU), AssignRowsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
