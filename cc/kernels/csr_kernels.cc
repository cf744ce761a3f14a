// Kernels of the minibatching and CSR-building ops: SceGetMinibatchSplitsWithPhysicalReplica,
// SceGetMinibatchesInCsrWithPhysicalReplica and SceConvertToSparseCoreCsrWrappedCooTensor.
#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/csr.h"
#include "cc/core/minibatch_splits.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

absl::Status RequireVector(const Tensor& t, const char* name, const std::string& table) {
  if (t.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", table, "': ", name, " must be rank 1, got rank ", t.dims()));
  }
  return absl::OkStatus();
}

int64_t OrOfSplits(const Tensor& splits) {
  int64_t bits = 0;
  auto flat = splits.flat<int64_t>();
  for (int64_t i = 0; i < flat.size(); ++i) bits |= flat(i);
  return bits;
}

// Allocates the four CSR buffers, runs `pack` into them and writes the scalar outputs. With
// `trim_to_size` the buffers hold exactly the unpadded sizes (a dry run computes them first)
// instead of TensorFlow's static capacity, which saves filling megabytes of padding per step.
template <typename PackFn>
void PackIntoOutputs(OpKernelContext* ctx, const sce::CsrParams& params, bool trim_to_size,
                     PackFn pack) {
  // Every size is validated (checked arithmetic, explicit bounds) before anything is allocated.
  sce::CsrBufferSizes sizes;
  OP_REQUIRES_OK(ctx, ToTf(sce::GetCsrBufferSizes(params, &sizes)));
  if (!trim_to_size) {
    const int64_t largest = std::max(sizes.row_pointers, sizes.ids);
    OP_REQUIRES(ctx, largest <= sce::kMaxAllocationElements,
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", params.table_name, "': the static CSR buffers would hold ",
                    sizes.row_pointers, " row pointers and ", sizes.ids,
                    " ids (max_minibatches_per_sc / max_ids_per_chip_per_sample x batch); the "
                    "limit is ", sce::kMaxAllocationElements,
                    " elements per buffer. Lower the attributes or pass trim_to_size=True")));
  }
  if (trim_to_size) {
    sce::CsrBuffers dry_run;
    OP_REQUIRES_OK(ctx, ToTf(pack(&dry_run)));
    sizes.row_pointers = dry_run.row_pointers_unpadded_size;
    sizes.ids = dry_run.ids_unpadded_size;
  }
  Tensor *row_pointers, *samples, *tokens, *gains;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({sizes.row_pointers}), &row_pointers));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({sizes.ids}), &samples));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({sizes.ids}), &tokens));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({sizes.ids}), &gains));
  sce::CsrBuffers buffers;
  buffers.row_pointers = row_pointers->flat<int32_t>().data();
  buffers.sample_ids = samples->flat<int32_t>().data();
  buffers.token_ids = tokens->flat<int32_t>().data();
  buffers.gains = gains->flat<float>().data();
  buffers.row_pointer_buffer_size = sizes.row_pointers;
  buffers.id_buffer_size = sizes.ids;
  OP_REQUIRES_OK(ctx, ToTf(pack(&buffers)));
  OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 4, buffers.row_pointers_unpadded_size));
  OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 5, buffers.ids_unpadded_size));
  OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 6, buffers.num_minibatches));
  OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, 7, buffers.num_dropped_ids));
  if (buffers.num_dropped_ids > 0) {
    LOG(WARNING) << "table '" << params.table_name << "': dropped " << buffers.num_dropped_ids
                 << " ids that did not fit the id buffer (allow_id_dropping is set)";
  }
}

// The attributes both CSR-building ops share, into the core's CsrParams.
absl::Status ReadCsrAttrs(OpKernelConstruction* ctx, sce::CsrParams* params,
                          int64_t* max_ids_per_chip_per_sample, bool* trim_to_size) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_replica", &params->num_replica));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_minibatches_per_sc", &params->max_minibatches_per_sc));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_ids_per_chip_per_sample", max_ids_per_chip_per_sample));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_sc_per_chip", &params->num_sc_per_chip));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &params->table_name));
  TF_RETURN_IF_ERROR(ctx->GetAttr("allow_id_dropping", &params->allow_id_dropping));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_division_level", &params->max_division_level));
  return ctx->GetAttr("trim_to_size", trim_to_size);
}

class ConvertToCsrWrappedCooTensorOp : public OpKernel {
 public:
  explicit ConvertToCsrWrappedCooTensorOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t per_sc, per_sample;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_count_per_sc", &per_sc));
    OP_REQUIRES_OK(ctx, ReadCsrAttrs(ctx, &params_, &per_sample, &trim_to_size_));
    // The id buffer capacity, overflow-checked: positions in it are int32.
    OP_REQUIRES_OK(ctx, ToTf(sce::WrappedCooIdBufferSize(
                            "table '" + params_.table_name + "'", per_sample, per_sc,
                            params_.num_sc_per_chip, sce::kMaxInt32,
                            &params_.max_ids_buffer_size)));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, cols, gains, counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_row_ids_list", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_col_ids_list", &cols));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_gains_list", &gains));
    OP_REQUIRES_OK(ctx, ctx->input_list("id_counts_list", &counts));
    std::vector<sce::SortedIdsView> per_sc(rows.size());
    for (int s = 0; s < rows.size(); ++s) {
      OP_REQUIRES_OK(ctx, RequireVector(rows[s], "sorted_row_ids", params_.table_name));
      OP_REQUIRES_OK(ctx, RequireVector(cols[s], "sorted_col_ids", params_.table_name));
      OP_REQUIRES_OK(ctx, RequireVector(gains[s], "sorted_gains", params_.table_name));
      OP_REQUIRES_OK(ctx, RequireVector(counts[s], "id_counts", params_.table_name));
      OP_REQUIRES(ctx, counts[s].NumElements() > 0,
                  absl::InvalidArgumentError(absl::StrCat("table '", params_.table_name,
                                                          "': id_counts must not be empty")));
      per_sc[s] = {rows[s].flat<int32_t>().data(),  cols[s].flat<int32_t>().data(),
                   gains[s].flat<float>().data(),   rows[s].NumElements(),
                   cols[s].NumElements(),           gains[s].NumElements(),
                   counts[s].flat<int32_t>().data(), counts[s].NumElements()};
    }
    // The four list inputs hold num_sc_per_chip tensors each, so `splits` is looked up by name
    // (its flat input index is 4 * num_sc_per_chip, not 4).
    const Tensor* splits_tensor;
    OP_REQUIRES_OK(ctx, ctx->input("splits", &splits_tensor));
    const int64_t splits = OrOfSplits(*splits_tensor);
    PackIntoOutputs(ctx, params_, trim_to_size_, [&](sce::CsrBuffers* out) {
      return sce::PackCsrFromSortedLists(per_sc, splits, params_, out);
    });
  }

 private:
  sce::CsrParams params_;
  bool trim_to_size_ = false;
};

class GetMinibatchSplitsOp : public OpKernel {
 public:
  explicit GetMinibatchSplitsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_count", &params_.sample_count));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_sc_per_chip", &params_.num_sc_per_chip));
    OP_REQUIRES_OK(ctx, ReadSplitsAttrs(ctx, &params_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& cols = ctx->input(2);
    const Tensor& gains = ctx->input(3);
    OP_REQUIRES_OK(ctx, RequireVector(rows, "row_ids", params_.table_name));
    OP_REQUIRES_OK(ctx, RequireVector(cols, "col_ids", params_.table_name));
    OP_REQUIRES_OK(ctx, RequireVector(gains, "gains", params_.table_name));
    sce::MinibatchSplits result;
    absl::Status allocation = absl::OkStatus();
    const sce::Status status = sce::GetMinibatchSplits(
        rows.flat<int32_t>().data(), cols.flat<int32_t>().data(), gains.flat<float>().data(),
        rows.NumElements(), cols.NumElements(), gains.NumElements(), params_, &result,
        ThreadPoolFor(ctx), SplitIdOutputs(ctx, &allocation));
    OP_REQUIRES_OK(ctx, allocation);
    OP_REQUIRES_OK(ctx, ToTf(status));
    OP_REQUIRES_OK(ctx, OutputSplitsSummary(ctx, result));
  }

 private:
  sce::MinibatchSplitsParams params_;
};

class GetMinibatchesInCsrOp : public OpKernel {
 public:
  explicit GetMinibatchesInCsrOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t sample_count, per_sample;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_count", &sample_count));
    OP_REQUIRES_OK(ctx, ReadCsrAttrs(ctx, &params_, &per_sample, &trim_to_size_));
    OP_REQUIRES(ctx, sample_count % params_.num_sc_per_chip == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", params_.table_name, "': sample_count (", sample_count,
                    ") must be divisible by num_sc_per_chip (", params_.num_sc_per_chip, ")")));
    OP_REQUIRES_OK(ctx, ToTf(sce::MinibatchCsrIdBufferSize(
                            "table '" + params_.table_name + "'", per_sample, sample_count,
                            sce::kMaxInt32, &params_.max_ids_buffer_size)));
  }

  void Compute(OpKernelContext* ctx) override {
    const char* names[] = {"row_ids", "col_ids", "gains", "splits", "id_counts"};
    for (int i = 1; i <= 5; ++i) {
      if (i == 4) continue;
      OP_REQUIRES_OK(ctx, RequireVector(ctx->input(i), names[i - 1], params_.table_name));
    }
    const Tensor& counts = ctx->input(5);
    OP_REQUIRES(ctx, counts.NumElements() > 0,
                absl::InvalidArgumentError(absl::StrCat("table '", params_.table_name,
                                                        "': id_counts must not be empty")));
    sce::SortedIdsView ids{ctx->input(1).flat<int32_t>().data(),
                           ctx->input(2).flat<int32_t>().data(),
                           ctx->input(3).flat<float>().data(),
                           ctx->input(1).NumElements(),
                           ctx->input(2).NumElements(),
                           ctx->input(3).NumElements(),
                           counts.flat<int32_t>().data(),
                           counts.NumElements()};
    const int64_t splits = OrOfSplits(ctx->input(4));
    PackIntoOutputs(ctx, params_, trim_to_size_, [&](sce::CsrBuffers* out) {
      return sce::PackCsrFromMinibatchSplits(ids, splits, params_, out);
    });
  }

 private:
  sce::CsrParams params_;
  bool trim_to_size_ = false;
};

REGISTER_KERNEL_BUILDER(Name("SceConvertToSparseCoreCsrWrappedCooTensor").Device(DEVICE_CPU),
                        ConvertToCsrWrappedCooTensorOp);
REGISTER_KERNEL_BUILDER(Name("SceGetMinibatchSplitsWithPhysicalReplica").Device(DEVICE_CPU),
                        GetMinibatchSplitsOp);
REGISTER_KERNEL_BUILDER(Name("SceGetMinibatchesInCsrWithPhysicalReplica").Device(DEVICE_CPU),
                        GetMinibatchesInCsrOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
