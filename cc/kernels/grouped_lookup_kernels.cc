// Kernels of the grouped forward lookup: SceGroupLookupEntries runs sce::CountEntriesPerActivationRow
// and sce::PlaceEntriesByActivationRow on a validated CSR; the lookups run
// sce::SparseDenseMatmulGrouped over a table given as a tensor or read in place from a resource
// variable (under a shared lock, no copy), after sce::ValidateGroupedEntries.
#include <cstring>

#include "cc/core/checked_math.h"
#include "cc/core/grouped_entries.h"
#include "cc/core/huge_pages.h"
#include "cc/kernels/kernel_utils.h"
#include "cc/kernels/lookup_table.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class GroupLookupEntriesOp : public OpKernel {
 public:
  explicit GroupLookupEntriesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_size", &input_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_rows", &table_rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_rows_per_sc", &feature_rows_per_sc_));
    OP_REQUIRES(ctx, input_size_ < sce::kMaxInt32,
                absl::InvalidArgumentError(absl::StrCat("table '", attrs_.table_name,
                                                        "': input_size must be below ",
                                                        sce::kMaxInt32, ", got ", input_size_)));
  }

  void Compute(OpKernelContext* ctx) override {
    sce::CsrView view;
    OP_REQUIRES_OK(ctx, MakeCsrView(ctx, attrs_, 4, input_size_, table_rows_, &view));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateFeatureRows(feature_rows_per_sc_, view)));
    OP_REQUIRES_OK(ctx, ToTf(sce::CheckGroupable(view)));
    const sce::ParallelFor parallel_for = ThreadPoolFor(ctx);
    Tensor* row_begin = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({input_size_ + 1}), &row_begin));
    int32_t* begin = row_begin->flat<int32_t>().data();
    int64_t total = 0;
    OP_REQUIRES_OK(ctx, ToTf(sce::CountEntriesPerActivationRow(view, feature_rows_per_sc_, begin,
                                                               &total, parallel_for)));
    Tensor *rows = nullptr, *gains = nullptr, cursor;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &gains));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({input_size_}), &cursor));
    if (input_size_ > 0) {
      std::memcpy(cursor.flat<int32_t>().data(), begin, sizeof(int32_t) * input_size_);
    }
    sce::PlaceEntriesByActivationRow(view, feature_rows_per_sc_, cursor.flat<int32_t>().data(),
                                     rows->flat<int32_t>().data(), gains->flat<float>().data(),
                                     parallel_for);
  }

 private:
  CsrAttrs attrs_;
  int64_t input_size_;
  int64_t table_rows_;
  sce::FeatureRowsPerSc feature_rows_per_sc_;
};

template <bool kResource>
class SparseDenseMatmulGroupedOp : public OpKernel {
 public:
  explicit SparseDenseMatmulGroupedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const char* names[] = {"activation_row_begin", "entry_rows", "entry_gains"};
    for (int i = 0; i < 3; ++i) {
      OP_REQUIRES(ctx, ctx->input(i).dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat("table '", table_name_, "': ", names[i],
                                                          " must be rank 1, got rank ",
                                                          ctx->input(i).dims())));
    }
    LockedVariables locked;
    const Tensor* table = &ctx->input(3);
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.Lock(ctx, {3}, {"embedding_table"}, table_name_,
                                      /*exclusive=*/false));
      table = locked.tensor(0);
    }
    OP_REQUIRES_OK(ctx, CheckLookupTable(*table, table_name_));
    sce::GroupedEntries entries;
    entries.row_begin = ctx->input(0).flat<int32_t>().data();
    entries.num_row_begin = ctx->input(0).NumElements();
    entries.rows = ctx->input(1).flat<int32_t>().data();
    entries.num_rows = ctx->input(1).NumElements();
    entries.gains = ctx->input(2).flat<float>().data();
    entries.num_gains = ctx->input(2).NumElements();
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateGroupedEntries(entries, table->dim_size(0), table_name_)));
    const int64_t rows = entries.num_activation_rows(), dim = table->dim_size(1);
    int64_t elements;
    OP_REQUIRES_OK(ctx, ToTf(sce::CheckedSize("table '" + table_name_ + "'",
                                              "the activations size rows * dim", {rows, dim},
                                              sce::kMaxAllocationElements, &elements)));
    Tensor* activations = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, dim}), &activations));
    // A table held in a variable is read at random every step: back it with huge pages.
    if (kResource) sce::BackWithHugePages(table->tensor_data().data(), table->TotalBytes());
    float* out = activations->flat<float>().data();
    const sce::ParallelFor parallel_for = ThreadPoolFor(ctx);
    WithTableRows(*table, [&](const auto* rows) {
      sce::SparseDenseMatmulGrouped(entries, rows, dim, out, parallel_for);
    });
  }

 private:
  std::string table_name_;
};

REGISTER_KERNEL_BUILDER(Name("SceGroupLookupEntries").Device(DEVICE_CPU), GroupLookupEntriesOp);
REGISTER_KERNEL_BUILDER(Name("SceSparseDenseMatmulGrouped").Device(DEVICE_CPU),
                        SparseDenseMatmulGroupedOp<false>);
REGISTER_KERNEL_BUILDER(Name("SceResourceSparseDenseMatmulGrouped").Device(DEVICE_CPU),
                        SparseDenseMatmulGroupedOp<true>);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
