// Kernels of SceGatheredSegmentSum and its per-feature forms: thin adapters over
// sce::GatheredSegmentSum.
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/gathered_segment_sum.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

// "<op>" or "<op>, table '<table_name>'": the prefix of every message of one kernel.
std::string Where(OpKernelConstruction* ctx, const char* op) {
  std::string table;
  const absl::Status status = ctx->GetAttr("table_name", &table);
  if (!status.ok()) ctx->CtxFailure(__FILE__, __LINE__, status);
  return table.empty() ? std::string(op) : absl::StrCat(op, ", table '", table, "'");
}

// positions, gains and segment ids (inputs first..first+2) into args: vectors of one length.
absl::Status EntryArgs(OpKernelContext* ctx, int first, const std::string& where,
                       sce::GatheredSegmentSumArgs* args) {
  const Tensor& positions = ctx->input(first);
  const Tensor& gains = ctx->input(first + 1);
  const Tensor& segments = ctx->input(first + 2);
  const int64_t n = positions.NumElements();
  if (positions.dims() != 1 || gains.dims() != 1 || segments.dims() != 1 ||
      gains.NumElements() != n || segments.NumElements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": positions, gains and segment_ids must be vectors of one length, got ",
        positions.shape().DebugString(), ", ", gains.shape().DebugString(), " and ",
        segments.shape().DebugString()));
  }
  args->positions = positions.flat<int32_t>().data();
  args->gains = gains.flat<float>().data();
  args->segments = segments.flat<int32_t>().data();
  args->num_entries = n;
  return absl::OkStatus();
}

// The scalar num_segments input into args.
absl::Status NumSegments(const Tensor& num_segments, const std::string& where,
                         sce::GatheredSegmentSumArgs* args) {
  if (!TensorShapeUtils::IsScalar(num_segments.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": num_segments must be a scalar, got ",
                                                   num_segments.shape().DebugString()));
  }
  args->num_segments = num_segments.scalar<int32_t>()();
  return absl::OkStatus();
}

// Checks every size and index, then allocates output 0 [num_segments, width] and sums into it.
void SumIntoNewOutput(OpKernelContext* ctx, const std::string& where,
                      const sce::GatheredSegmentSumArgs& args) {
  OP_REQUIRES_OK(ctx, ToTf(sce::ValidateGatheredSegmentSum(args, where)));
  Tensor* out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({args.num_segments, args.width}),
                                           &out));
  sce::GatheredSegmentSum(args, out->flat<float>().data(), ThreadPoolFor(ctx),
                          IntraOpThreads(ctx));
}

class GatheredSegmentSumOp : public OpKernel {
 public:
  explicit GatheredSegmentSumOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), where_(Where(ctx, "SceGatheredSegmentSum")) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    OP_REQUIRES(ctx, rows.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(where_, ": rows must be rank 2, got ",
                                                        rows.shape().DebugString())));
    sce::GatheredSegmentSumArgs args;
    OP_REQUIRES_OK(ctx, EntryArgs(ctx, 1, where_, &args));
    OP_REQUIRES_OK(ctx, NumSegments(ctx->input(4), where_, &args));
    args.rows = rows.flat<float>().data();
    args.num_rows = rows.dim_size(0);
    args.width = rows.dim_size(1);
    SumIntoNewOutput(ctx, where_, args);
  }

 private:
  std::string where_;
};

REGISTER_KERNEL_BUILDER(Name("SceGatheredSegmentSum").Device(DEVICE_CPU), GatheredSegmentSumOp);

// Shared by the per-feature forms: the table name and the feature blocks.
class FeatureSegmentSumBase : public OpKernel {
 public:
  FeatureSegmentSumBase(OpKernelConstruction* ctx, const char* op)
      : OpKernel(ctx), where_(Where(ctx, op)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sparse_cores", &sparse_cores_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_rows_per_sc", &rows_per_sc_));
    int64_t num_features;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_features));
    OP_REQUIRES(ctx, num_features == static_cast<int64_t>(rows_per_sc_.size()),
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": N = ", num_features, " features but feature_rows_per_sc has ",
                    rows_per_sc_.size(), " entries")));
    OP_REQUIRES_OK(ctx, ToTf(sce::CheckFeatureBlocks(sparse_cores_, rows_per_sc_, where_,
                                                     &stacked_rows_)));
  }

 protected:
  int64_t FeatureRows(size_t f) const { return sparse_cores_ * rows_per_sc_[f]; }

  std::string where_;
  int64_t sparse_cores_ = 0;
  std::vector<int64_t> rows_per_sc_;
  int64_t stacked_rows_ = 0;
};

// Rows -> activations written straight into one output per feature (no split afterwards).
class GatheredSegmentSumToFeaturesOp : public FeatureSegmentSumBase {
 public:
  explicit GatheredSegmentSumToFeaturesOp(OpKernelConstruction* ctx)
      : FeatureSegmentSumBase(ctx, "SceGatheredSegmentSumToFeatures") {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    OP_REQUIRES(ctx, rows.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat(where_, ": rows must be rank 2, got ",
                                                        rows.shape().DebugString())));
    sce::GatheredSegmentSumArgs args;
    OP_REQUIRES_OK(ctx, EntryArgs(ctx, 1, where_, &args));
    args.rows = rows.flat<float>().data();
    args.num_rows = rows.dim_size(0);
    args.width = rows.dim_size(1);
    args.num_segments = stacked_rows_;
    OpInputList row_indices;
    OP_REQUIRES_OK(ctx, ctx->input_list("row_indices", &row_indices));
    OP_REQUIRES(ctx, row_indices.size() <= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": at most one row_indices vector, got ", row_indices.size())));
    // With row indices, position p is the row rows[row_indices[p]], read in place: one pointer
    // per index, each checked to lie in rows first.
    std::vector<const float*> indexed_rows;
    if (row_indices.size() == 1) {
      const Tensor& indices = row_indices[0];
      OP_REQUIRES(ctx, indices.dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": row_indices must be a vector, got ",
                      indices.shape().DebugString())));
      const int32_t* index = indices.flat<int32_t>().data();
      const int64_t count = indices.NumElements();
      // Positions index rows as int32: more indices could never be read, and are not allocated.
      OP_REQUIRES(ctx, count <= sce::kMaxInt32,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": row_indices has ", count, " entries, more than ",
                      sce::kMaxInt32)));
      indexed_rows.resize(count);
      for (int64_t p = 0; p < count; ++p) {
        OP_REQUIRES(ctx, index[p] >= 0 && index[p] < args.num_rows,
                    absl::InvalidArgumentError(absl::StrCat(
                        where_, ": row_indices[", p, "] = ", index[p], " is outside the ",
                        args.num_rows, " rows")));
        indexed_rows[p] = args.rows + static_cast<int64_t>(index[p]) * args.width;
      }
      args.row_table = indexed_rows.data();
      args.num_rows = count;
    }
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateGatheredSegmentSum(args, where_)));
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("activations", &outputs));
    std::vector<float*> features;
    for (size_t f = 0; f < rows_per_sc_.size(); ++f) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(static_cast<int>(f),
                                           TensorShape({FeatureRows(f), args.width}), &out));
      features.push_back(out->flat<float>().data());
    }
    if (args.width == 0) return;   // nothing to sum into
    std::vector<float*> table;
    sce::FeatureRowTable(sparse_cores_, rows_per_sc_, features, args.width, &table);
    args.out_table = table.data();
    sce::GatheredSegmentSum(args, nullptr, ThreadPoolFor(ctx), IntraOpThreads(ctx));
  }
};

// Activation gradients, one input per feature, -> one gradient row per segment (no concat first).
class GatheredSegmentSumFromFeaturesOp : public FeatureSegmentSumBase {
 public:
  explicit GatheredSegmentSumFromFeaturesOp(OpKernelConstruction* ctx)
      : FeatureSegmentSumBase(ctx, "SceGatheredSegmentSumFromFeatures") {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList gradients;
    OP_REQUIRES_OK(ctx, ctx->input_list("gradients", &gradients));
    const int num_features = gradients.size();   // N, checked against the blocks at construction
    int64_t width = -1;
    std::vector<const float*> features;
    for (int f = 0; f < num_features; ++f) {
      const Tensor& g = gradients[f];
      if (width < 0 && g.dims() == 2) width = g.dim_size(1);
      OP_REQUIRES(ctx, g.dims() == 2 && g.dim_size(0) == FeatureRows(f) && g.dim_size(1) == width,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": gradients[", f, "] must be [", FeatureRows(f), ", ",
                      width < 0 ? std::string("width") : absl::StrCat(width), "], got ",
                      g.shape().DebugString())));
      features.push_back(g.flat<float>().data());
    }
    sce::GatheredSegmentSumArgs args;
    OP_REQUIRES_OK(ctx, NumSegments(ctx->input(num_features + 3), where_, &args));
    OP_REQUIRES_OK(ctx, EntryArgs(ctx, num_features, where_, &args));
    // One pointer per stacked row, only for rows with columns: the gradients, shape-checked
    // above, hold at least as many floats as the table has pointers.
    std::vector<const float*> table;
    if (width > 0) {
      sce::FeatureRowTable(sparse_cores_, rows_per_sc_, features, width, &table);
      args.row_table = table.data();
    }
    args.num_rows = stacked_rows_;
    args.width = width;
    SumIntoNewOutput(ctx, where_, args);
  }
};

REGISTER_KERNEL_BUILDER(Name("SceGatheredSegmentSumToFeatures").Device(DEVICE_CPU),
                        GatheredSegmentSumToFeaturesOp);
REGISTER_KERNEL_BUILDER(Name("SceGatheredSegmentSumFromFeatures").Device(DEVICE_CPU),
                        GatheredSegmentSumFromFeaturesOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
