// TensorFlow kernels of the oneCCL transport's ops (cc/ops/oneccl_ops.cc) over
// cc/transport/oneccl_communicator.h. Built into their own library, linked against oneCCL, only
// when the optional extra is installed (tf_sc_embedding/collectives/oneccl_library.py).
#include <cmath>
#include <string>
#include <vector>

#include "cc/kernels/status_to_tf.h"
#include "cc/transport/oneccl_communicator.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace {

using sce_kernels::ToTf;

class CreateStoreOp : public OpKernel {
 public:
  explicit CreateStoreOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &communicator_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string address;
    OP_REQUIRES_OK(ctx, ToTf(sce::oneccl::CreateMainStore(communicator_, &address)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = address;
  }

 private:
  std::string communicator_;
};

class ConnectOp : public OpKernel {
 public:
  explicit ConnectOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &communicator_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_seconds_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("peers", &peers_));
    OP_REQUIRES(ctx, std::isfinite(timeout_seconds_) && timeout_seconds_ >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "SceOnecclConnect: timeout_seconds must be a finite number >= 0, got ",
                    timeout_seconds_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& address = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(address.shape()),
                absl::InvalidArgumentError("SceOnecclConnect: address must be a scalar"));
    OP_REQUIRES_OK(ctx, ToTf(sce::oneccl::Connect(
        communicator_, static_cast<int>(size_), static_cast<int>(rank_),
        std::string(address.scalar<tstring>()()), timeout_seconds_, peers_)));
  }

 private:
  std::string communicator_;
  int64_t size_ = 0;
  int64_t rank_ = 0;
  float timeout_seconds_ = 0;
  std::vector<std::string> peers_;
};

// Queues `collective` on its communicator; the kernel finishes (`done`) on the communicator's
// thread once the bytes arrived, or at once if it cannot be queued.
void SubmitAsync(OpKernelContext* ctx, const std::string& communicator,
                 sce::oneccl::Collective collective, AsyncOpKernel::DoneCallback done) {
  collective.done = [ctx, done](const sce::Status& status) {
    ctx->SetStatus(ToTf(status));
    done();
  };
  OP_REQUIRES_OK_ASYNC(ctx, ToTf(sce::oneccl::Submit(communicator, std::move(collective))), done);
}

// One collective: the output is allocated here, the bytes move on the communicator's thread, and
// the kernel finishes when they arrived (no TensorFlow thread waits).
class CollectiveOp : public AsyncOpKernel {
 public:
  explicit CollectiveOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &communicator_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group_size", &group_size_));
    std::string kind;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind));
    kind_ = kind == "all_to_all" ? sce::oneccl::Kind::kAllToAll : sce::oneccl::Kind::kAllGather;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, input.dims() >= 1,
                      absl::InvalidArgumentError(absl::StrCat(
                          name(), ": the input must have rank >= 1, got shape ",
                          input.shape().DebugString())),
                      done);
    TensorShape shape = input.shape();
    const int64_t bytes = input.TotalBytes();
    size_t chunk_bytes = 0;
    if (kind_ == sce::oneccl::Kind::kAllToAll) {
      OP_REQUIRES_ASYNC(ctx, input.dim_size(0) == group_size_,
                        absl::InvalidArgumentError(absl::StrCat(
                            name(), ": all_to_all needs one row per rank (", group_size_,
                            "), got shape ", input.shape().DebugString())),
                        done);
      chunk_bytes = static_cast<size_t>(bytes / group_size_);
    } else {
      int64_t rows = 0;
      OP_REQUIRES_ASYNC(ctx, !__builtin_mul_overflow(input.dim_size(0), group_size_, &rows),
                        absl::InvalidArgumentError(absl::StrCat(
                            name(), ": the gathered rows overflow int64")),
                        done);
      OP_REQUIRES_OK_ASYNC(ctx, shape.SetDimWithStatus(0, rows), done);
      chunk_bytes = static_cast<size_t>(bytes);
    }
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, shape, &output), done);
    sce::oneccl::Collective collective;
    collective.kind = kind_;
    collective.send = input.tensor_data().data();
    collective.receive = const_cast<char*>(output->tensor_data().data());
    collective.chunk_bytes = chunk_bytes;
    SubmitAsync(ctx, communicator_, std::move(collective), std::move(done));
  }

 private:
  std::string communicator_;
  int64_t group_size_ = 0;
  sce::oneccl::Kind kind_ = sce::oneccl::Kind::kAllToAll;
};

// A ragged all-to-all: row d of the input goes to rank d, only its first lengths[d] elements; row
// s of the output holds what rank s sent (received_lengths[s] elements, then zeros). The output's
// width is known once the ranks exchanged their lengths, so it is allocated on the
// communicator's thread.
class RaggedAllToAllOp : public AsyncOpKernel {
 public:
  explicit RaggedAllToAllOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &communicator_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("group_size", &group_size_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    const Tensor& lengths = ctx->input(1);
    OP_REQUIRES_ASYNC(ctx, input.dims() == 2 && input.dim_size(0) == group_size_,
                      absl::InvalidArgumentError(absl::StrCat(
                          name(), ": the input must be [group_size = ", group_size_,
                          ", chunk], got shape ", input.shape().DebugString())),
                      done);
    OP_REQUIRES_ASYNC(ctx, lengths.dims() == 1 && lengths.dim_size(0) == group_size_,
                      absl::InvalidArgumentError(absl::StrCat(
                          name(), ": lengths must be [group_size = ", group_size_, "], got shape ",
                          lengths.shape().DebugString())),
                      done);
    const uint64_t element = DataTypeSize(input.dtype());
    const int64_t chunk = input.dim_size(1);
    sce::oneccl::Collective collective;
    collective.kind = sce::oneccl::Kind::kRaggedAllToAll;
    collective.send = input.tensor_data().data();
    collective.chunk_bytes = static_cast<size_t>(chunk) * element;
    collective.element_bytes = element;
    const auto length = lengths.vec<int64_t>();
    for (int64_t d = 0; d < group_size_; ++d) {
      OP_REQUIRES_ASYNC(ctx, length(d) >= 0 && length(d) <= chunk,
                        absl::InvalidArgumentError(absl::StrCat(
                            name(), ": lengths[", d, "] = ", length(d), " is outside [0, ",
                            chunk, "], the input's chunk")),
                        done);
      collective.send_bytes.push_back(static_cast<uint64_t>(length(d)) * element);
    }
    const int64_t ranks = group_size_;
    collective.allocate = [ctx, element, ranks](const std::vector<uint64_t>& receive_bytes,
                                                size_t stride, char** receive) {
      Tensor* output = nullptr;
      Tensor* received = nullptr;
      const int64_t width = static_cast<int64_t>(stride / element);
      int64_t elements = 0;
      if (__builtin_mul_overflow(width, ranks, &elements)) {
        return sce::InvalidArgument("the received chunks (", ranks, " x ", width,
                                    " elements) overflow int64");
      }
      absl::Status status = ctx->allocate_output(0, TensorShape({ranks, width}), &output);
      if (status.ok()) status = ctx->allocate_output(1, TensorShape({ranks}), &received);
      if (!status.ok()) {
        return sce::Unavailable("allocating the received chunks failed: ", status.message());
      }
      for (int64_t s = 0; s < ranks; ++s) {
        received->vec<int64_t>()(s) = static_cast<int64_t>(receive_bytes[s] / element);
      }
      *receive = const_cast<char*>(output->tensor_data().data());
      return sce::Status::Ok();
    };
    SubmitAsync(ctx, communicator_, std::move(collective), std::move(done));
  }

 private:
  std::string communicator_;
  int64_t group_size_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("SceOnecclCreateStore").Device(DEVICE_CPU), CreateStoreOp);
REGISTER_KERNEL_BUILDER(Name("SceOnecclConnect").Device(DEVICE_CPU), ConnectOp);
REGISTER_KERNEL_BUILDER(Name("SceOnecclCollective").Device(DEVICE_CPU), CollectiveOp);
REGISTER_KERNEL_BUILDER(Name("SceOnecclRaggedAllToAll").Device(DEVICE_CPU), RaggedAllToAllOp);

}  // namespace
}  // namespace tensorflow
