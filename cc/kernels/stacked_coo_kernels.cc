// Kernels of the ops that take all features of one stacked table: SceConvertFeaturesToStackedCooTensor
// (sce::ConvertFeaturesToStackedCoo / sce::WriteStackedCoo) and SceConvertFeaturesToMinibatchSplits
// (sce::GetStackedMinibatchSplits). Thin adapters: attributes and tensors in, core calls, outputs.
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/stacked_coo.h"
#include "cc/core/stacked_splits.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

// The per-feature attributes (N entries each) and the stacking attributes, as core features
// without inputs; errors name `op`.
absl::Status ReadStackedFeatures(OpKernelConstruction* ctx, const std::string& op,
                                 std::vector<sce::StackedFeature>* features) {
  int64_t n, sc, shards, stacked_samples;
  std::vector<int64_t> samples, row_offsets, col_offsets, col_shifts, vocabulary_sizes;
  std::vector<std::string> combiners, tables, names;
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(ctx->GetAttr("sample_counts", &samples));
  TF_RETURN_IF_ERROR(ctx->GetAttr("row_offsets", &row_offsets));
  TF_RETURN_IF_ERROR(ctx->GetAttr("col_offsets", &col_offsets));
  TF_RETURN_IF_ERROR(ctx->GetAttr("col_shifts", &col_shifts));
  TF_RETURN_IF_ERROR(ctx->GetAttr("vocabulary_sizes", &vocabulary_sizes));
  TF_RETURN_IF_ERROR(ctx->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_names", &tables));
  TF_RETURN_IF_ERROR(ctx->GetAttr("feature_names", &names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_sc_per_chip", &sc));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_sc_shards", &shards));
  TF_RETURN_IF_ERROR(ctx->GetAttr("stacked_table_sample_count", &stacked_samples));
  const size_t count = static_cast<size_t>(n);
  for (size_t size : {samples.size(), row_offsets.size(), col_offsets.size(), col_shifts.size(),
                      vocabulary_sizes.size(), combiners.size(), tables.size(), names.size()}) {
    if (size != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": every per-feature attribute must have N = ", n, " entries, one has ", size));
    }
  }
  if (sc > sce::kMaxSparseCoresPerChip) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_sc_per_chip must be in [1, ",
                                                   sce::kMaxSparseCoresPerChip, "], got ", sc));
  }
  if (!sce::IsPowerOfTwo(shards)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_sc_shards must be a power of two, got ", shards));
  }
  features->resize(count);
  for (size_t f = 0; f < count; ++f) {
    sce::StackedFeature& x = (*features)[f];
    x.context.table = tables[f];
    x.context.feature = names[f];
    TF_RETURN_IF_ERROR(ToTf(sce::ParseCombiner(combiners[f], &x.combiner)));
    x.sample_count = samples[f];
    x.vocabulary_size = vocabulary_sizes[f];
    x.transform.num_sc_per_chip = sc;
    x.transform.row_offset = row_offsets[f];
    x.transform.col_offset = col_offsets[f];
    x.transform.col_shift = col_shifts[f];
    x.transform.num_sc_shards = shards;
    x.transform.stacked_table_sample_count = stacked_samples;
  }
  return absl::OkStatus();
}

// The attribute features with this call's input tensors (no copies).
absl::Status WithInputs(OpKernelContext* ctx, const std::vector<sce::StackedFeature>& attrs,
                        std::vector<sce::StackedFeature>* features) {
  OpInputList splits, values, weights;
  TF_RETURN_IF_ERROR(ctx->input_list("indices_or_row_splits", &splits));
  TF_RETURN_IF_ERROR(ctx->input_list("values", &values));
  TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
  *features = attrs;
  for (size_t f = 0; f < features->size(); ++f) {
    (*features)[f].input = IdInputFromTensors(splits[f], values[f], weights[f]);
  }
  return absl::OkStatus();
}

class ConvertFeaturesToStackedCooOp : public OpKernel {
 public:
  explicit ConvertFeaturesToStackedCooOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx,
                   ReadStackedFeatures(ctx, "SceConvertFeaturesToStackedCooTensor", &features_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<sce::StackedFeature> features;
    OP_REQUIRES_OK(ctx, WithInputs(ctx, features_, &features));
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

class ConvertFeaturesToMinibatchSplitsOp : public OpKernel {
 public:
  explicit ConvertFeaturesToMinibatchSplitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(
        ctx, ReadStackedFeatures(ctx, "SceConvertFeaturesToMinibatchSplits", &features_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stacked_table_sample_count", &params_.sample_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_per_chip", &params_.num_sc_per_chip));
    OP_REQUIRES_OK(ctx, ReadSplitsAttrs(ctx, &params_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<sce::StackedFeature> features;
    OP_REQUIRES_OK(ctx, WithInputs(ctx, features_, &features));
    sce::MinibatchSplits result;
    absl::Status allocation = absl::OkStatus();
    const sce::Status status = sce::GetStackedMinibatchSplits(
        features, params_, &result, ThreadPoolFor(ctx), SplitIdOutputs(ctx, &allocation));
    OP_REQUIRES_OK(ctx, allocation);
    OP_REQUIRES_OK(ctx, ToTf(status));
    OP_REQUIRES_OK(ctx, OutputSplitsSummary(ctx, result));
  }

 private:
  std::vector<sce::StackedFeature> features_;
  sce::MinibatchSplitsParams params_;
};

REGISTER_KERNEL_BUILDER(Name("SceConvertFeaturesToStackedCooTensor").Device(DEVICE_CPU),
                        ConvertFeaturesToStackedCooOp);
REGISTER_KERNEL_BUILDER(Name("SceConvertFeaturesToMinibatchSplits").Device(DEVICE_CPU),
                        ConvertFeaturesToMinibatchSplitsOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
