// Kernels of the fused backward + optimizer ops, one pair per optimizer definition: the functional
// form updates copies of its inputs, the resource form updates the variables in place. Every input
// is validated before the first write, so a failing step changes nothing.
#include <algorithm>
#include <array>
#include <atomic>
#include <utility>
#include <vector>
#include <string>

#include "cc/core/checked_math.h"
#include "cc/core/fused_update.h"
#include "cc/core/huge_pages.h"
#include "cc/core/optimizers.h"
#include "cc/core/touched_rows.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

// Inputs: the four CSR buffers, the activation gradients (one tensor in the functional form, N in
// the resource form), the learning rate, the table and its slots, the minibatch count.
constexpr int kGradientsInput = 4;

template <typename Optimizer, bool kResource>
class FusedUpdateOp : public OpKernel {
 public:
  static constexpr size_t kNumSlots = Optimizer::kSlots.size();

  explicit FusedUpdateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    if (kResource) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &num_gradients_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("feature_rows_per_sc", &feature_rows_per_sc_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("num_touched", &num_touched_));
      OP_REQUIRES(ctx, num_touched_ <= 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': at most one touched-row flags variable")));
      std::vector<int64_t> seeds, offsets, rotations;
      std::string rounding;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_seeds", &seeds));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_row_offsets", &offsets));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_rotations", &rotations));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding", &rounding));
      OP_REQUIRES(ctx, seeds.size() == offsets.size() && seeds.size() == rotations.size(),
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': rounding_seeds, rounding_row_offsets and "
                      "rounding_rotations must have one entry per member table")));
      for (size_t m = 0; m < seeds.size(); ++m) {
        const bool increasing = m == 0 ? offsets[m] == 0 : offsets[m] > offsets[m - 1];
        OP_REQUIRES(ctx, increasing && rotations[m] >= 0,
                    absl::InvalidArgumentError(absl::StrCat(
                        "table '", attrs_.table_name, "': rounding_row_offsets must start at 0 "
                        "and increase, rounding_rotations be >= 0")));
        rounding_.members.push_back({offsets[m], rotations[m], static_cast<uint64_t>(seeds[m])});
      }
      rounding_.stochastic = rounding == "stochastic";
    }
    learning_rate_input_ = kGradientsInput + num_gradients_;
    table_input_ = learning_rate_input_ + 1;
    minibatches_input_ = table_input_ + 1 + static_cast<int>(kNumSlots);
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
      } else if (spec.type == sce::HyperType::kRowWidth) {
        int64_t value;
        OP_REQUIRES_OK(ctx, ctx->GetAttr(spec.name, &value));
        // Checked here (not by the attribute's type, whose error would not name the table) and
        // against the table's width in Compute; exact as a float up to 2^24.
        OP_REQUIRES(ctx, value >= 1 && value <= (int64_t{1} << 24),
                    absl::InvalidArgumentError(absl::StrCat(
                        "table '", attrs_.table_name, "': ", spec.name, " must be in [1, 2^24], got ",
                        value)));
        row_width_ = value;
        hypers_[i] = static_cast<float>(value);
      } else {
        OP_REQUIRES_OK(ctx, ctx->GetAttr(spec.name, &hypers_[i]));
      }
    }
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<int> variable_inputs;
    std::vector<std::string> variable_names = {"embedding_table"};
    for (size_t i = 0; i <= kNumSlots; ++i) variable_inputs.push_back(table_input_ + i);
    for (const char* slot : Optimizer::kSlots) variable_names.push_back(slot);
    const bool tracked = kResource && num_touched_ == 1;
    if (tracked) {   // the flags variable, locked with the table (touched_rows.h)
      variable_inputs.push_back(minibatches_input_ + 2);
      variable_names.push_back("flags");
    }
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
      for (size_t i = 0; i <= kNumSlots; ++i) inputs[i] = &ctx->input(table_input_ + i);
    }
    const Tensor& table = *inputs[0];
    // A variable may hold 16-bit rows, given the member tables' rounding layout.
    const bool narrow = kResource && (table.dtype() == DT_BFLOAT16 || table.dtype() == DT_HALF);
    OP_REQUIRES(ctx, table.dims() == 2 && (table.dtype() == DT_FLOAT || narrow),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': embedding_table must be a float32 matrix",
                    kResource ? " (a variable may also hold bfloat16 or float16)" : "", ", got ",
                    DataTypeString(table.dtype()), " ", table.shape().DebugString())));
    OP_REQUIRES(ctx, !narrow || !rounding_.members.empty(),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': a ", DataTypeString(table.dtype()),
                    " table needs rounding_seeds, rounding_row_offsets and rounding_rotations")));
    for (size_t i = 0; i < kNumSlots; ++i) {
      const bool row_wise = Optimizer::kSlotShapes[i] == sce::SlotShape::kRowWise;
      const TensorShape expected(
          {table.dim_size(0), sce::SlotRowWidth(Optimizer::kSlotShapes[i], table.dim_size(1))});
      OP_REQUIRES(ctx, inputs[i + 1]->shape() == expected,
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': slot '", Optimizer::kSlots[i],
                      "' has shape ", inputs[i + 1]->shape().DebugString(), " but the table has shape ",
                      table.shape().DebugString(), row_wise ? ", so this row-wise slot must be " : "",
                      row_wise ? expected.DebugString() : "")));
    }
    if (tracked) {
      const Tensor& flags = *locked.tensor(kNumSlots + 1);
      OP_REQUIRES(ctx, flags.dtype() == DT_UINT8 && flags.dims() == 1 &&
                           flags.dim_size(0) == table.dim_size(0),
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': the touched-row flags must be a uint8 "
                      "vector of the table's ", table.dim_size(0), " rows, got ",
                      DataTypeString(flags.dtype()), " ", flags.shape().DebugString())));
    }
    OP_REQUIRES(ctx, row_width_ <= table.dim_size(1),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': embedding_dim ", row_width_,
                    " exceeds the table's width ", table.dim_size(1))));
    // Every gradient tensor is a matrix of the table's width; their rows add up to the activation
    // rows the CSR refers to (checked against the CSR below).
    std::vector<int64_t> part_rows(num_gradients_);
    std::vector<const float*> parts(num_gradients_);
    int64_t input_size = 0;
    for (int i = 0; i < num_gradients_; ++i) {
      const Tensor& grads = ctx->input(kGradientsInput + i);
      OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(1) == table.dim_size(1),
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': activation_gradients",
                      num_gradients_ > 1 ? absl::StrCat("[", i, "]") : std::string(),
                      " must be a matrix with the table's width ", table.dim_size(1),
                      ", got shape ", grads.shape().DebugString())));
      part_rows[i] = grads.dim_size(0);
      parts[i] = grads.flat<float>().data();
      OP_REQUIRES(ctx, sce::CheckedAdd(input_size, part_rows[i], &input_size) &&
                           input_size <= sce::kMaxInt32,
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name,
                      "': activation_gradients hold more than ", sce::kMaxInt32, " rows")));
    }
    int64_t rounding_step = 0;
    if (kResource) {
      const Tensor& step = ctx->input(minibatches_input_ + 1);
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': rounding_step must be a scalar, got "
                      "shape ", step.shape().DebugString())));
      rounding_step = step.scalar<int64_t>()();
    }
    const Tensor& lr = ctx->input(learning_rate_input_);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(lr.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "table '", attrs_.table_name, "': learning_rate must be a scalar, got shape ",
                    lr.shape().DebugString())));
    sce::CsrView view;
    OP_REQUIRES_OK(ctx, MakeCsrView(ctx, attrs_, minibatches_input_, input_size,
                                    table.dim_size(0), &view));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateFeatureRows(feature_rows_per_sc_, view)));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateGradientParts(view, feature_rows_per_sc_, part_rows,
                                                        "activation_gradients")));
    const int64_t dim = table.dim_size(1);
    const sce::GradientRows grads(view, feature_rows_per_sc_, parts, dim);

    // Non-finite gradients: one vectorizable pass over the gradients and the gains decides; only
    // when it finds a NaN or Inf are the referenced rows looked at (before any write).
    std::vector<uint8_t> bad_activation_rows;
    if (!AllGradientsFinite(ctx, parts, part_rows, dim) ||
        !sce::AllFinite(view.gains, view.num_gains)) {
      sce::NonFiniteContribution first;
      sce::FindNonFiniteContributions(view, grads, dim, &bad_activation_rows, &first);
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
    void* table_rows = nullptr;
    if (kResource) {
      OP_REQUIRES_OK(ctx, locked.MakeExclusive(ctx));
      for (size_t i = 0; i <= kNumSlots; ++i) {
        Tensor& variable = *locked.tensor(i);
        void* data = const_cast<char*>(variable.tensor_data().data());
        if (i == 0) table_rows = data;
        targets[i] = static_cast<float*>(data);  // (the table's is used only when float32)
        // The table and its slots are read and written at random rows every step.
        sce::BackWithHugePages(data, variable.TotalBytes());
      }
    } else {
      for (size_t i = 0; i <= kNumSlots; ++i) {
        const Tensor* in = inputs[i];
        Tensor* out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({table_input_ + static_cast<int>(i)},
                                                                  i, in->shape(), &out));
        if (out->flat<float>().data() != in->flat<float>().data()) {
          std::copy_n(in->flat<float>().data(), in->NumElements(), out->flat<float>().data());
        }
        targets[i] = out->flat<float>().data();
      }
    }
    std::array<float*, kNumSlots> slots;
    for (size_t i = 0; i < kNumSlots; ++i) slots[i] = targets[i + 1];
    const uint8_t* bad = bad_activation_rows.empty() ? nullptr : bad_activation_rows.data();
    int64_t skipped = 0;
    if (narrow) {
      sce::RowRounding rounding = rounding_;
      rounding.num_shards = view.num_shards();
      rounding.step = rounding_step;
      int64_t overflow_row = -1;
      skipped = table.dtype() == DT_BFLOAT16
                    ? sce::FusedUpdateNarrow<Optimizer>(
                          view, grads, dim, lr.flat<float>()(0), hypers_.data(), clip_,
                          static_cast<sce::Bfloat16*>(table_rows), rounding, slots,
                          ThreadPoolFor(ctx), bad, &overflow_row)
                    : sce::FusedUpdateNarrow<Optimizer>(
                          view, grads, dim, lr.flat<float>()(0), hypers_.data(), clip_,
                          static_cast<sce::Float16*>(table_rows), rounding, slots,
                          ThreadPoolFor(ctx), bad, &overflow_row);
      OP_REQUIRES(ctx, skipped >= 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "table '", attrs_.table_name, "': the update takes a value of row ",
                      overflow_row, " of the table given beyond float16's range (|value| > "
                      "65504). Nothing was updated. Lower the learning rate, clip the weights "
                      "(clip_weight_min / clip_weight_max) or store the table in bfloat16")));
    } else {
      skipped = sce::FusedUpdate<Optimizer>(view, grads, dim, lr.flat<float>()(0),
                                            hypers_.data(), clip_, targets[0], slots,
                                            ThreadPoolFor(ctx), bad);
    }
    if (tracked) {   // sized above: marking cannot fail
      Tensor& flags = *locked.tensor(kNumSlots + 1);
      OP_REQUIRES_OK(ctx, ToTf(sce::MarkTouchedRows(
                              view, reinterpret_cast<uint8_t*>(
                                        const_cast<char*>(flags.tensor_data().data())),
                              flags.dim_size(0))));
    }
    OP_REQUIRES_OK(ctx, OutputInt32Scalar(ctx, kResource ? 0 : static_cast<int>(kNumSlots) + 1,
                                          skipped));
    if (skipped > 0) {
      LOG(WARNING) << "table '" << attrs_.table_name << "': skipped " << skipped
                   << " rows with non-finite gradients (non_finite_gradients='skip')";
    }
  }

 private:
  // The finiteness pass over all gradient rows, in parallel chunks of about 1 MiB.
  static bool AllGradientsFinite(OpKernelContext* ctx, const std::vector<const float*>& parts,
                                 const std::vector<int64_t>& part_rows, int64_t dim) {
    constexpr int64_t kChunk = int64_t{1} << 18;  // floats
    std::vector<std::pair<const float*, int64_t>> chunks;
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t n = part_rows[i] * dim;  // fits: a tensor's element count
      for (int64_t at = 0; at < n; at += kChunk) {
        chunks.emplace_back(parts[i] + at, std::min(kChunk, n - at));
      }
    }
    std::atomic<bool> finite{true};
    ThreadPoolFor(ctx)(static_cast<int64_t>(chunks.size()), kChunk, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e && finite.load(std::memory_order_relaxed); ++c) {
        if (!sce::AllFinite(chunks[c].first, chunks[c].second)) finite = false;
      }
    });
    return finite.load();
  }

  CsrAttrs attrs_;
  int num_gradients_ = 1;
  int num_touched_ = 0;   // 1: the rows written are marked in a flags variable
  sce::FeatureRowsPerSc feature_rows_per_sc_;
  int learning_rate_input_ = 0, table_input_ = 0, minibatches_input_ = 0;
  sce::NonFiniteGradients non_finite_ = sce::NonFiniteGradients::kError;
  sce::Clip clip_;
  int64_t row_width_ = 0;  // a kRowWidth hyperparameter's value (0: the optimizer has none)
  sce::RowRounding rounding_;  // the member layout and rounding of 16-bit tables (resource form)
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
