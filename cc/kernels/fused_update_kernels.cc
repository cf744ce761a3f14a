// Kernels of the fused backward + optimizer ops, one pair per optimizer definition: the functional
// form updates copies of its inputs, the resource form updates the variables in place. Every input
// is validated before the first write, so a failing step changes nothing.
#include <array>
#include <string>

#include "cc/core/fused_update.h"
#include "cc/core/optimizers.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

constexpr int kGradientsInput = 4;
constexpr int kLearningRateInput = 5;
constexpr int kTableInput = 6;

template <typename Optimizer, bool kResource>
class FusedUpdateOp : public OpKernel {
 public:
  static constexpr size_t kNumSlots = Optimizer::kSlots.size();
  static constexpr int kMinibatchesInput = kTableInput + 1 + static_cast<int>(kNumSlots);

  explicit FusedUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clip_weight_min", &clip_.min));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clip_weight_max", &clip_.max));
    OP_REQUIRES(ctx, clip_.min <= clip_.max,
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': clip_weight_min (", clip_.min,
                    ") must not exceed clip_weight_max (", clip_.max, ")")));
    for (size_t i = 0; i < Optimizer::kHypers.size(); ++i) {
      const sce::HyperSpec& spec = Optimizer::kHypers[i];
      if (spec.type == sce::HyperType::kBool) {
        bool value;
        OP_REQUIRES_OK(ctx, ctx->GetAttr(spec.name, &value));
        hypers_[i] = value ? 1.0f : 0.0f;
      } else {
        OP_REQUIRES_OK(ctx, ctx->GetAttr(spec.name, &hypers_[i]));
      }
    }
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<int> variable_inputs;
    for (size_t i = 0; i <= kNumSlots; ++i) variable_inputs.push_back(kTableInput + i);
    LockedVariables locked;
    std::array<const Tensor*, kNumSlots + 1> inputs;
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.Lock(ctx, variable_inputs, /*exclusive=*/true));
      for (size_t i = 0; i <= kNumSlots; ++i) inputs[i] = locked.tensor(i);
    } else {
      for (size_t i = 0; i <= kNumSlots; ++i) inputs[i] = &ctx->input(kTableInput + i);
    }
    const Tensor& table = *inputs[0];
    OP_REQUIRES(ctx, table.dims() == 2 && table.dtype() == DT_FLOAT,
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': embedding_table must be a float32 matrix, got ",
                    table.shape().DebugString())));
    for (size_t i = 0; i < kNumSlots; ++i) {
      OP_REQUIRES(ctx, inputs[i + 1]->shape() == table.shape(),
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': slot '", Optimizer::kSlots[i],
                      "' has shape ", inputs[i + 1]->shape().DebugString(),
                      " but the table has shape ", table.shape().DebugString())));
    }
    const Tensor& grads = ctx->input(kGradientsInput);
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(1) == table.dim_size(1),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name,
                    "': activation_gradients must be a matrix with the table's width ",
                    table.dim_size(1), ", got shape ", grads.shape().DebugString())));
    const Tensor& lr = ctx->input(kLearningRateInput);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(lr.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': learning_rate must be a scalar, got shape ",
                    lr.shape().DebugString())));
    sce::CsrView view;
    OP_REQUIRES_OK(ctx, MakeCsrView(ctx, attrs_, kMinibatchesInput, grads.dim_size(0),
                                    table.dim_size(0), &view));

    // Everything is valid: from here on the update cannot fail part-way.
    std::array<float*, kNumSlots + 1> targets;
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.MakeExclusive(ctx));
      for (size_t i = 0; i <= kNumSlots; ++i) targets[i] = locked.tensor(i)->flat<float>().data();
    } else {
      for (size_t i = 0; i <= kNumSlots; ++i) {
        const Tensor* in = inputs[i];
        Tensor* out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({kTableInput + static_cast<int>(i)},
                                                                  i, in->shape(), &out));
        if (out->flat<float>().data() != in->flat<float>().data()) {
          std::copy_n(in->flat<float>().data(), in->NumElements(), out->flat<float>().data());
        }
        targets[i] = out->flat<float>().data();
      }
    }
    std::array<float*, kNumSlots> slots;
    for (size_t i = 0; i < kNumSlots; ++i) slots[i] = targets[i + 1];
    sce::FusedUpdate<Optimizer>(view, grads.flat<float>().data(), table.dim_size(1),
                                lr.flat<float>()(0), hypers_.data(), clip_, targets[0], slots,
                                ThreadPoolFor(ctx));
  }

 private:
  CsrAttrs attrs_;
  sce::Clip clip_;
  std::array<float, Optimizer::kHypers.size() + 1> hypers_{};
};

template <typename Optimizer, bool kResource>
OpKernel* CreateFusedUpdateOp(OpKernelConstruction* ctx) {
  return new FusedUpdateOp<Optimizer, kResource>(ctx);
}

struct RegisterFusedKernels {
  template <typename Optimizer>
  void operator()() const {
    const std::string suffix = std::string(Optimizer::kOpName) + "AndCsrInput";
    Register<Optimizer, false>("SceXlaSparseDenseMatmulGradWith" + suffix);
    Register<Optimizer, true>("SceResourceSparseDenseMatmulGradWith" + suffix);
  }
  template <typename Optimizer, bool kResource>
  static void Register(const std::string& op_name) {
    const KernelDef* def = register_kernel::Name(op_name.c_str()).Device(DEVICE_CPU).Build();
    kernel_factory::OpKernelRegistrar registrar(def, "FusedUpdateOp",
                                                &CreateFusedUpdateOp<Optimizer, kResource>);
    (void)registrar;
  }
};

const bool kRegistered = [] {
  sce::ForEachOptimizer(RegisterFusedKernels());
  return true;
}();

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
