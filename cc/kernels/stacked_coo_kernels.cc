// Kernel of SceConvertFeaturesToStackedCooTensor: a thin adapter around
// sce::ConvertFeaturesToStackedCoo / sce::WriteStackedCoo.
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/stacked_coo.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

class ConvertFeaturesToStackedCooOp : public OpKernel {
 public:
  explicit ConvertFeaturesToStackedCooOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t n, sc, shards, stacked_samples;
    std::vector<int64_t> samples, row_offsets, col_offsets, col_shifts, vocabulary_sizes;
    std::vector<std::string> combiners, tables, names;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_counts", &samples));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_offsets", &row_offsets));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_offsets", &col_offsets));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_shifts", &col_shifts));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("vocabulary_sizes", &vocabulary_sizes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &combiners));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &tables));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_names", &names));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_per_chip", &sc));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_shards", &shards));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stacked_table_sample_count", &stacked_samples));
    const size_t count = static_cast<size_t>(n);
    for (size_t size : {samples.size(), row_offsets.size(), col_offsets.size(),
                        col_shifts.size(), vocabulary_sizes.size(), combiners.size(),
                        tables.size(), names.size()}) {
      OP_REQUIRES(ctx, size == count,
                  absl::InvalidArgumentError(absl::StrCat(
                      "SceConvertFeaturesToStackedCooTensor: every per-feature attribute must "
                      "have N = ", n, " entries, one has ", size)));
    }
    OP_REQUIRES(ctx, sc <= sce::kMaxSparseCoresPerChip,
                absl::InvalidArgumentError(absl::StrCat(
                    "SceConvertFeaturesToStackedCooTensor: num_sc_per_chip must be in [1, ",
                    sce::kMaxSparseCoresPerChip, "], got ", sc)));
    OP_REQUIRES(ctx, sce::IsPowerOfTwo(shards),
                absl::InvalidArgumentError(absl::StrCat(
                    "SceConvertFeaturesToStackedCooTensor: num_sc_shards must be a power of two, "
                    "got ", shards)));
    features_.resize(count);
    for (size_t f = 0; f < count; ++f) {
      sce::StackedFeature& x = features_[f];
      x.context.table = tables[f];
      x.context.feature = names[f];
      OP_REQUIRES_OK(ctx, ToTf(sce::ParseCombiner(combiners[f], &x.combiner)));
      x.sample_count = samples[f];
      x.vocabulary_size = vocabulary_sizes[f];
      x.transform.num_sc_per_chip = sc;
      x.transform.row_offset = row_offsets[f];
      x.transform.col_offset = col_offsets[f];
      x.transform.col_shift = col_shifts[f];
      x.transform.num_sc_shards = shards;
      x.transform.stacked_table_sample_count = stacked_samples;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = static_cast<int>(features_.size());
    OpInputList splits, values, weights;
    OP_REQUIRES_OK(ctx, ctx->input_list("indices_or_row_splits", &splits));
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    std::vector<sce::StackedFeature> features = features_;
    for (int f = 0; f < n; ++f) {
      features[f].input = IdInputFromTensors(splits[f], values[f], weights[f]);
    }
    const sce::ParallelFor parallel_for = ThreadPoolFor(ctx);
    sce::StackedCooParts parts;
    OP_REQUIRES_OK(ctx, ToTf(sce::ConvertFeaturesToStackedCoo(features, parallel_for, &parts)));
    Tensor *rows = nullptr, *cols = nullptr, *gains = nullptr;
    const TensorShape shape({parts.total});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, shape, &cols));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, shape, &gains));
    OP_REQUIRES_OK(ctx, ToTf(sce::WriteStackedCoo(features, parts, rows->flat<int32_t>().data(),
                                                  cols->flat<int32_t>().data(),
                                                  gains->flat<float>().data(), parallel_for)));
  }

 private:
  std::vector<sce::StackedFeature> features_;
};

REGISTER_KERNEL_BUILDER(Name("SceConvertFeaturesToStackedCooTensor").Device(DEVICE_CPU),
                        ConvertFeaturesToStackedCooOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
