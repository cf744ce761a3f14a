#include "cc/kernels/kernel_utils.h"

#include <algorithm>
#include <cstring>

#include "cc/core/constants.h"
#include "cc/core/split_encoding.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace sce_kernels {

sce::ParallelFor ThreadPoolFor(OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t n, int64_t cost, const sce::RangeFn& work) {
    if (n <= 0) return;
    if (n == 1) {
      work(0, 1);
      return;
    }
    pool->ParallelFor(n, cost, [&work](int64_t begin, int64_t end) { work(begin, end); });
  };
}

absl::Status GetShardGridAttrs(OpKernelConstruction* ctx, sce::ShardGrid* grid) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_replicas", &grid->num_replicas));
  TF_RETURN_IF_ERROR(ctx->GetAttr("sparse_cores_per_replica", &grid->sparse_cores_per_replica));
  return ctx->GetAttr("rows_per_shard", &grid->rows_per_shard);
}

int64_t IntraOpThreads(OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers->NumThreads();
}

int64_t SparseCoresOrDefault(int64_t n) {
  return n == -1 ? sce::kDefaultSparseCoresPerReplica : n;
}

sce::IdInput IdInputFromTensors(const Tensor& indices, const Tensor& values,
                                const Tensor& weights) {
  sce::IdInput in;
  in.index_rank = indices.dims();
  in.index_dim0 = indices.dims() >= 1 ? indices.dim_size(0) : 0;
  in.index_dim1 = indices.dims() >= 2 ? indices.dim_size(1) : 0;
  in.index_data = indices.NumElements() > 0 ? indices.flat<int32_t>().data() : nullptr;
  in.values_rank = values.dims();
  in.num_values = values.NumElements();
  in.values = values.flat<int32_t>().data();
  in.weights_rank = weights.dims();
  in.num_weights = weights.NumElements();
  in.weights = weights.flat<float>().data();
  return in;
}

absl::Status OutputInt32Scalar(OpKernelContext* ctx, int index, int64_t value) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape({}), &out));
  out->scalar<int32_t>()() = static_cast<int32_t>(value);
  return absl::OkStatus();
}

absl::Status ReadSplitsAttrs(OpKernelConstruction* ctx, sce::MinibatchSplitsParams* params) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_replica", &params->num_replica));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_vocab_size", &params->table_vocab_size));
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &params->table_name));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_ids_per_partition", &params->max_ids_per_partition));
  TF_RETURN_IF_ERROR(
      ctx->GetAttr("max_unique_ids_per_partition", &params->max_unique_ids_per_partition));
  // Read as int64 and checked here: read as int, a value beyond int32 fails in TensorFlow with
  // a message that does not name the table.
  int64_t level;
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_division_level", &level));
  TF_RETURN_IF_ERROR(
      ToTf(sce::CheckDivisionLevel("table '" + params->table_name + "'", level)));
  params->max_division_level = static_cast<int>(level);
  return absl::OkStatus();
}

sce::SplitIdAllocator SplitIdOutputs(OpKernelContext* ctx, absl::Status* allocation) {
  return [ctx, allocation](int64_t total, sce::SplitIdBuffers* buffers) {
    Tensor* out[3];
    for (int i = 0; i < 3 && allocation->ok(); ++i) {
      *allocation = ctx->allocate_output(i, TensorShape({total}), &out[i]);
    }
    if (!allocation->ok()) return sce::FailedPrecondition(allocation->message());
    *buffers = {out[0]->flat<int32_t>().data(), out[1]->flat<int32_t>().data(),
                out[2]->flat<float>().data()};
    return sce::Status::Ok();
  };
}

absl::Status OutputSplitsSummary(OpKernelContext* ctx, const sce::MinibatchSplits& result) {
  Tensor* splits;
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({}), &splits));
  splits->scalar<int64_t>()() = result.splits;
  TF_RETURN_IF_ERROR(OutputVector(ctx, 4, result.id_counts));
  TF_RETURN_IF_ERROR(OutputInt32Scalar(ctx, 5, result.max_ids));
  return OutputInt32Scalar(ctx, 6, result.max_uniques);
}

absl::Status CsrAttrs::Read(OpKernelConstruction* ctx) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &table_name));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_sparsecores_per_device", &num_sparsecores_per_device));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_replica", &num_replica));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_source_replicas", &num_source_replicas));
  TF_RETURN_IF_ERROR(ctx->GetAttr("first_local_shard", &first_local_shard));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_local_shards", &num_local_shards));
  num_sparsecores_per_device = SparseCoresOrDefault(num_sparsecores_per_device);
  return absl::OkStatus();
}

absl::Status MakeCsrView(OpKernelContext* ctx, const CsrAttrs& attrs, int num_minibatches_input,
                         int64_t input_size, int64_t table_rows, sce::CsrView* view) {
  const char* names[] = {"row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains"};
  for (int i = 0; i < 4; ++i) {
    if (ctx->input(i).dims() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("table '", attrs.table_name, "': ", names[i],
                                                     " must be rank 1, got rank ",
                                                     ctx->input(i).dims()));
    }
  }
  const Tensor& minibatches = ctx->input(num_minibatches_input);
  if (!TensorShapeUtils::IsScalar(minibatches.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", attrs.table_name,
                     "': num_minibatches_per_physical_sparse_core must be a scalar"));
  }
  view->row_pointers = ctx->input(0).flat<int32_t>().data();
  view->num_row_pointers = ctx->input(0).NumElements();
  view->sample_ids = ctx->input(1).flat<int32_t>().data();
  view->num_sample_ids = ctx->input(1).NumElements();
  view->token_ids = ctx->input(2).flat<int32_t>().data();
  view->num_token_ids = ctx->input(2).NumElements();
  view->gains = ctx->input(3).flat<float>().data();
  view->num_gains = ctx->input(3).NumElements();
  view->num_minibatches = minibatches.flat<int32_t>()(0);
  view->num_sc_per_device = attrs.num_sparsecores_per_device;
  view->num_replica = attrs.num_replica;
  view->input_size = input_size;
  view->table_rows = table_rows;
  view->num_source_replicas = attrs.num_source_replicas;
  view->first_local_shard = attrs.first_local_shard;
  view->num_local_shards = attrs.num_local_shards;
  view->table_name = attrs.table_name;
  return ToTf(sce::ValidateCsrView(*view));
}

absl::Status LockedVariables::Lock(OpKernelContext* ctx, const std::vector<int>& inputs,
                                   const std::vector<std::string>& names,
                                   const std::string& table_name, bool exclusive) {
  exclusive_ = exclusive;
  for (size_t k = 0; k < inputs.size(); ++k) {
    core::RefCountPtr<Var> var;
    absl::Status status = LookupResource(ctx, HandleFromInput(ctx, inputs[k]), &var);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("table '", table_name, "': variable '", names[k],
                                       "' could not be read: ", status.message()));
    }
    vars_.push_back(std::move(var));
  }
  std::vector<mutex*> mutexes;
  for (auto& var : vars_) mutexes.push_back(var->mu());
  std::sort(mutexes.begin(), mutexes.end());
  mutexes.erase(std::unique(mutexes.begin(), mutexes.end()), mutexes.end());
  for (mutex* mu : mutexes) {
    if (exclusive_) {
      mu->lock();
    } else {
      mu->lock_shared();
    }
    locked_.push_back(mu);
  }
  for (size_t k = 0; k < vars_.size(); ++k) {
    if (!vars_[k]->is_initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", table_name, "': variable '", names[k], "' is not initialized"));
    }
    // The table itself may hold 16-bit rows (read and written through row_precision.h) and
    // touched-row flags are uint8 (touched_rows_kernels.cc); slots and every other variable
    // are float32.
    const DataType dtype = vars_[k]->tensor()->dtype();
    const bool table = names[k] == "embedding_table";
    if (names[k] == "flags" && dtype == DT_UINT8) continue;
    if (dtype != DT_FLOAT && !(table && (dtype == DT_BFLOAT16 || dtype == DT_HALF))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table_name, "': variable '", names[k], "' must be float32",
          table ? ", bfloat16 or float16" : "", ", got ", DataTypeString(dtype)));
    }
  }
  return absl::OkStatus();
}

absl::Status LockedVariables::RequireDistinct(const std::vector<std::string>& names,
                                              const std::string& table_name) const {
  for (size_t a = 0; a < vars_.size(); ++a) {
    for (size_t b = a + 1; b < vars_.size(); ++b) {
      if (vars_[a].get() == vars_[b].get()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", table_name, "': the same variable is passed as '", names[a], "' and '",
            names[b], "'; the table and every slot must be distinct variables"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LockedVariables::MakeExclusive(OpKernelContext* ctx) {
  for (auto& var : vars_) {
    Tensor* t = var->tensor();
    if (t->RefCountIsOne()) continue;
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(t->dtype(), t->shape(), &copy));
    std::memcpy(const_cast<char*>(copy.tensor_data().data()), t->tensor_data().data(),
                t->TotalBytes());
    *t = copy;
  }
  return absl::OkStatus();
}

LockedVariables::~LockedVariables() {
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) {
    if (exclusive_) {
      (*it)->unlock();
    } else {
      (*it)->unlock_shared();
    }
  }
}

}  // namespace sce_kernels
}  // namespace tensorflow
