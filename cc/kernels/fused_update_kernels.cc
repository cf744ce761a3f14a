// Kernels of the fused backward + optimizer ops, one pair per optimizer definition: the functional
// form updates copies of its inputs, the resource form updates the variables in place. Every input
// is validated before the first write, so a failing step changes nothing.
#include <array>
#include <string>

#include "cc/core/checked_math.h"
#include "cc/core/fused_update.h"
#include "cc/core/huge_pages.h"
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
    std::string non_finite;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("non_finite_gradients", &non_finite));
    OP_REQUIRES_OK(ctx, ToTf(sce::ParseNonFiniteGradients(non_finite, &non_finite_)));
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
    std::vector<std::string> variable_names = {"embedding_table"};
    for (size_t i = 0; i <= kNumSlots; ++i) variable_inputs.push_back(kTableInput + i);
    for (const char* slot : Optimizer::kSlots) variable_names.push_back(slot);
    LockedVariables locked;
    std::array<const Tensor*, kNumSlots + 1> inputs;
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.Lock(ctx, variable_inputs, variable_names, attrs_.table_name,
                                      /*exclusive=*/true));
      // The update reads and writes the table and every slot row by row: one variable passed
      // twice would read its own writes.
      OP_REQUIRES_OK(ctx, locked.RequireDistinct(variable_names, attrs_.table_name));
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
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(1) == table.dim_size(1) &&
                         grads.dim_size(0) <= sce::kMaxInt32,
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

    // Non-finite gradients: one vectorizable pass over the gradients and the gains decides; only
    // when it finds a NaN or Inf are the referenced rows looked at (before any write).
    const int64_t dim = table.dim_size(1);
    const float* grad_data = grads.flat<float>().data();
    std::vector<uint8_t> bad_activation_rows;
    if (!sce::AllFinite(grad_data, grads.NumElements()) ||
        !sce::AllFinite(view.gains, view.num_gains)) {
      sce::NonFiniteContribution first;
      sce::FindNonFiniteContributions(view, grad_data, dim, &bad_activation_rows, &first);
      if (!first.found) {
        bad_activation_rows.clear();  // only unreferenced rows / padding: nothing to skip
      } else if (non_finite_ == sce::NonFiniteGradients::kError) {
        ctx->CtxFailure(absl::InvalidArgumentError(absl::StrCat(
            "table '", attrs_.table_name, "': ",
            first.bad_gain ? absl::StrCat("sorted_gains[", first.position, "] is ", first.gain)
                           : absl::StrCat("activation_gradients row ", first.activation_row,
                                          " has a non-finite value (NaN or Inf)"),
            "; it contributes to row ", first.token, " of shard ", first.shard,
            " (row ", first.table_row, " of the table given). Nothing was updated. Pass "
            "non_finite_gradients='skip' to skip the rows such gradients touch instead")));
        return;
      }
    }

    // Everything is valid: from here on the update cannot fail part-way.
    std::array<float*, kNumSlots + 1> targets;
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.MakeExclusive(ctx));
      for (size_t i = 0; i <= kNumSlots; ++i) {
        Tensor& variable = *locked.tensor(i);
        targets[i] = variable.flat<float>().data();
        // The table and its slots are read and written at random rows every step.
        sce::BackWithHugePages(targets[i], variable.TotalBytes());
      }
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
    const int64_t skipped = sce::FusedUpdate<Optimizer>(
        view, grad_data, dim, lr.flat<float>()(0), hypers_.data(), clip_, targets[0], slots,
        ThreadPoolFor(ctx), bad_activation_rows.empty() ? nullptr : bad_activation_rows.data());
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, kResource ? 0 : static_cast<int>(kNumSlots) + 1,
                                          skipped));
    if (skipped > 0) {
      LOG(WARNING) << "table '" << attrs_.table_name << "': skipped " << skipped
                   << " rows with non-finite gradients (non_finite_gradients='skip')";
    }
  }

 private:
  CsrAttrs attrs_;
  sce::NonFiniteGradients non_finite_ = sce::NonFiniteGradients::kError;
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
