// Kernels of ScePackReplicaChunks and SceUnpackReplicaChunks: thin adapters over
// cc/core/replica_chunks.h.
#include <string>
#include <vector>

#include "cc/core/replica_chunks.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

std::string Where(const char* op, const std::string& label) {
  return label.empty() ? std::string(op) : absl::StrCat(op, " (", label, ")");
}

// counts must be [W >= 1, num_tables].
absl::Status CheckCounts(const Tensor& counts, int64_t num_tables, const std::string& where) {
  if (counts.dims() != 2 || counts.dim_size(1) != num_tables || counts.dim_size(0) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": counts must be [replicas >= 1, ", num_tables, "], got ",
        counts.shape().DebugString()));
  }
  return absl::OkStatus();
}

// The counts and chunk inputs of a pack op (input `first` and the next) into chunks, checked.
absl::Status PackInputs(OpKernelContext* ctx, int first, int64_t num_tables,
                        const std::string& where, sce::ReplicaChunks* chunks) {
  const Tensor& counts = ctx->input(first);
  const Tensor& chunk = ctx->input(first + 1);
  TF_RETURN_IF_ERROR(CheckCounts(counts, num_tables, where));
  if (!TensorShapeUtils::IsScalar(chunk.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": chunk must be a scalar, got ",
                                                   chunk.shape().DebugString()));
  }
  chunks->num_replicas = counts.dim_size(0);
  chunks->chunk = chunk.scalar<int32_t>()();
  chunks->counts = counts.flat<int32_t>().data();
  return absl::OkStatus();
}

template <typename T>
class PackReplicaChunksOp : public OpKernel {
 public:
  explicit PackReplicaChunksOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string label;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label));
    where_ = Where("ScePackReplicaChunks", label);
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList values;
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    sce::ReplicaChunks chunks;
    OP_REQUIRES_OK(ctx, PackInputs(ctx, values.size(), values.size(), where_, &chunks));
    std::vector<const uint32_t*> tables;
    for (int t = 0; t < values.size(); ++t) {
      const Tensor& v = values[t];
      OP_REQUIRES(ctx, v.dims() == 1 || v.dims() == 2,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": values[", t, "] must be rank 1 or 2, got ",
                      v.shape().DebugString())));
      chunks.widths.push_back(v.dims() == 1 ? 1 : v.dim_size(1));
      tables.push_back(reinterpret_cast<const uint32_t*>(v.flat<T>().data()));
    }
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateReplicaChunks(chunks, where_, &rows)));
    for (int t = 0; t < values.size(); ++t) {
      OP_REQUIRES(ctx, rows[t] == values[t].dim_size(0),
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": counts[:, ", t, "] add up to ", rows[t], " entries, values[", t,
                      "] has ", values[t].dim_size(0))));
    }
    Tensor* buffer = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({chunks.num_replicas * chunks.chunk}), &buffer));
    sce::PackReplicaChunks(chunks, tables, reinterpret_cast<uint32_t*>(buffer->flat<T>().data()));
  }

 private:
  std::string where_;
};

template <typename T>
class UnpackReplicaChunksOp : public OpKernel {
 public:
  explicit UnpackReplicaChunksOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string label;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label));
    where_ = Where("SceUnpackReplicaChunks", label);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("widths", &widths_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("flat", &flat_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_multiples", &row_multiples_));
    for (int64_t w : widths_) {
      OP_REQUIRES(ctx, w >= 1 && (!flat_ || w == 1),
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": widths must be at least 1 (exactly 1 with flat), got ", w)));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& buffer = ctx->input(0);
    const Tensor& counts = ctx->input(1);
    const int64_t num_tables = static_cast<int64_t>(widths_.size());
    OP_REQUIRES_OK(ctx, CheckCounts(counts, num_tables, where_));
    const int64_t replicas = counts.dim_size(0);
    OP_REQUIRES(ctx, buffer.dims() == 1 && buffer.NumElements() % replicas == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": buffer must be a vector of replicas (", replicas,
                    ") equal chunks, got ", buffer.shape().DebugString())));
    sce::ReplicaChunks chunks;
    chunks.num_replicas = replicas;
    chunks.chunk = buffer.NumElements() / replicas;
    chunks.widths = widths_;
    chunks.counts = counts.flat<int32_t>().data();
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateReplicaChunks(chunks, where_, &rows)));
    std::vector<int64_t> padded;
    OP_REQUIRES_OK(ctx, ToTf(sce::PaddedRows(chunks, rows, row_multiples_, where_, &padded)));
    std::vector<uint32_t*> tables;
    for (int64_t t = 0; t < num_tables; ++t) {
      Tensor* out = nullptr;
      const int64_t n = padded.empty() ? rows[t] : padded[t];
      const TensorShape shape = flat_ ? TensorShape({n}) : TensorShape({n, widths_[t]});
      OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(t), shape, &out));
      tables.push_back(reinterpret_cast<uint32_t*>(out->flat<T>().data()));
    }
    sce::UnpackReplicaChunks(chunks, reinterpret_cast<const uint32_t*>(buffer.flat<T>().data()),
                             tables, padded);
  }

 private:
  std::string where_;
  std::vector<int64_t> widths_;
  std::vector<int64_t> row_multiples_;
  bool flat_ = false;
};

template <typename T>
class PackGatheredReplicaChunksOp : public OpKernel {
 public:
  explicit PackGatheredReplicaChunksOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string label;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("label", &label));
    where_ = Where("ScePackGatheredReplicaChunks", label);
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList params, indices;
    OP_REQUIRES_OK(ctx, ctx->input_list("params", &params));
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    const int num_tables = params.size();
    sce::ReplicaChunks chunks;
    OP_REQUIRES_OK(ctx, PackInputs(ctx, 2 * num_tables, num_tables, where_, &chunks));
    std::vector<sce::GatheredTable> tables(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      const Tensor& p = params[t];
      const Tensor& i = indices[t];
      OP_REQUIRES(ctx, p.dims() == 2 && i.dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": params[", t, "] must be a matrix and indices[", t,
                      "] a vector, got ", p.shape().DebugString(), " and ",
                      i.shape().DebugString())));
      chunks.widths.push_back(p.dim_size(1));
      tables[t].source = reinterpret_cast<const uint32_t*>(p.flat<T>().data());
      tables[t].source_rows = p.dim_size(0);
      tables[t].indices = i.flat<int32_t>().data();
    }
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateReplicaChunks(chunks, where_, &rows)));
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES(ctx, rows[t] == indices[t].dim_size(0),
                  absl::InvalidArgumentError(absl::StrCat(
                      where_, ": counts[:, ", t, "] add up to ", rows[t], " entries, indices[",
                      t, "] has ", indices[t].dim_size(0))));
    }
    OP_REQUIRES_OK(ctx, ToTf(sce::CheckGatherIndices(tables, rows, where_)));
    Tensor* buffer = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({chunks.num_replicas * chunks.chunk}), &buffer));
    sce::PackGatheredReplicaChunks(chunks, tables,
                                   reinterpret_cast<uint32_t*>(buffer->flat<T>().data()));
  }

 private:
  std::string where_;
};

#define SCE_REGISTER_CHUNK_KERNELS(T)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("ScePackReplicaChunks").Device(DEVICE_CPU).TypeConstraint<T>("T"),                  \
      PackReplicaChunksOp<T>);                                                                 \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("SceUnpackReplicaChunks").Device(DEVICE_CPU).TypeConstraint<T>("T"),                \
      UnpackReplicaChunksOp<T>);                                                               \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name("ScePackGatheredReplicaChunks").Device(DEVICE_CPU).TypeConstraint<T>("T"),          \
      PackGatheredReplicaChunksOp<T>);
SCE_REGISTER_CHUNK_KERNELS(int32_t)
SCE_REGISTER_CHUNK_KERNELS(float)
#undef SCE_REGISTER_CHUNK_KERNELS

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
