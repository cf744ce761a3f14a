// Glue between TensorFlow kernels and the TensorFlow-free algorithms in cc/core: status
// translation, the intra-op thread pool as a ParallelFor, and views of input tensors.
#ifndef SCE_KERNELS_KERNEL_UTILS_H_
#define SCE_KERNELS_KERNEL_UTILS_H_

#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/coo.h"
#include "cc/core/csr_view.h"
#include "cc/core/minibatch_splits.h"
#include "cc/core/parallel.h"
#include "cc/core/status.h"
#include "cc/kernels/status_to_tf.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace sce_kernels {

// Runs work over [0, n) on the kernel's intra-op thread pool.
sce::ParallelFor ThreadPoolFor(OpKernelContext* ctx);

// The number of threads of that pool (for algorithms whose work grows with the number of ranges
// they split into).
int64_t IntraOpThreads(OpKernelContext* ctx);

// Reads the num_replicas, sparse_cores_per_replica and rows_per_shard attributes of the exchange
// ops (their ranges are checked by the core's validation).
absl::Status GetShardGridAttrs(OpKernelConstruction* ctx, sce::ShardGrid* grid);

// Resolves num_sparsecores_per_device = -1 to the default of 4 SparseCores.
int64_t SparseCoresOrDefault(int64_t num_sparsecores_per_device);

// The three inputs of the ConvertTo* ops as a core IdInput (no copies).
sce::IdInput IdInputFromTensors(const Tensor& indices_or_row_splits, const Tensor& values,
                                const Tensor& weights);

// Copies an int32 / float vector into a Tensor output.
template <typename T>
absl::Status OutputVector(OpKernelContext* ctx, int index, const std::vector<T>& data) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(index, TensorShape({static_cast<int64_t>(data.size())}), &out));
  std::copy(data.begin(), data.end(), out->flat<T>().data());
  return absl::OkStatus();
}

absl::Status OutputInt32Scalar(OpKernelContext* ctx, int index, int64_t value);

// The attributes of the minibatch-splits kernels besides the batch (sample_count) and the
// SparseCores: num_replica, table_vocab_size, table_name, the two limits and max_division_level.
absl::Status ReadSplitsAttrs(OpKernelConstruction* ctx, sce::MinibatchSplitsParams* params);

// Outputs 0-2 (sorted_row_ids, sorted_col_ids, sorted_gains) of the minibatch-splits kernels as
// the core's SplitIdAllocator, so the deduplicated ids are written once, in place. A failed
// allocation (out of memory) is kept in *allocation, to be reported as TensorFlow gave it.
sce::SplitIdAllocator SplitIdOutputs(OpKernelContext* ctx, absl::Status* allocation);

// Outputs 3-6 (splits, id_counts, max_ids, max_uniques) of the minibatch-splits kernels.
absl::Status OutputSplitsSummary(OpKernelContext* ctx, const sce::MinibatchSplits& result);

// Attributes shared by the lookup and fused-update kernels.
struct CsrAttrs {
  std::string table_name;
  int64_t num_sparsecores_per_device = -1;
  int64_t num_replica = 1;
  int64_t num_source_replicas = 1;
  int64_t first_local_shard = 0;
  int64_t num_local_shards = -1;
  absl::Status Read(OpKernelConstruction* ctx);
};

// Builds and validates a CsrView over inputs 0-3 and the minibatch count input.
absl::Status MakeCsrView(OpKernelContext* ctx, const CsrAttrs& attrs, int num_minibatches_input,
                         int64_t input_size, int64_t table_rows, sce::CsrView* view);

// Locks a set of resource variables in address order (avoids deadlocks between concurrent
// steps) and, where a buffer is shared with a reader, gives the variable its own copy first so
// that in-place updates never change a tensor someone else holds.
class LockedVariables {
 public:
  // `names` are the op-definition argument names of `inputs` (for messages naming the table and
  // the argument, e.g. "table 'video': variable 'accumulator' must be float32, got double").
  absl::Status Lock(OpKernelContext* ctx, const std::vector<int>& inputs,
                    const std::vector<std::string>& names, const std::string& table_name,
                    bool exclusive);
  ~LockedVariables();
  Tensor* tensor(size_t i) { return vars_[i]->tensor(); }
  // InvalidArgument naming the table and both arguments when one variable was passed twice.
  absl::Status RequireDistinct(const std::vector<std::string>& names,
                               const std::string& table_name) const;
  absl::Status MakeExclusive(OpKernelContext* ctx);

 private:
  std::vector<core::RefCountPtr<Var>> vars_;
  std::vector<mutex*> locked_;
  bool exclusive_ = false;
};

}  // namespace sce_kernels
}  // namespace tensorflow

#endif  // SCE_KERNELS_KERNEL_UTILS_H_
