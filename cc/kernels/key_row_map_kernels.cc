// Kernels of the key-to-row map ops (cc/ops/key_row_map_ops.cc): a ResourceBase that owns one
// shard's sce::KeyRowMap behind a mutex, and thin adapters that check tensor shapes and hand the
// buffers to the core.
#include <memory>
#include <string>
#include <vector>

#include "cc/core/key_row_map.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

std::string Where(const std::string& table_name) { return "table '" + table_name + "'"; }

class KeyRowMapResource : public ResourceBase {
 public:
  KeyRowMapResource(std::string table_name, std::unique_ptr<sce::KeyRowMap> map)
      : table_name_(std::move(table_name)), map_(std::move(map)) {}

  std::string DebugString() const override {
    return "key-to-row map of " + Where(table_name_);
  }
  int64_t MemoryUsed() const override {
    const sce::KeyRowMapConfig& c = map_->config();
    return c.capacity * (16 + 8) + (c.admission_threshold > 1 ? c.pending_capacity * 22 : 0);
  }

  mutex* mu() { return &mu_; }
  const std::string& table_name() const { return table_name_; }
  sce::KeyRowMap* map() { return map_.get(); }

 private:
  const std::string table_name_;
  mutex mu_;
  std::unique_ptr<sce::KeyRowMap> map_;
};

absl::Status LookupMap(OpKernelContext* ctx, core::RefCountPtr<KeyRowMapResource>* map) {
  return LookupResource(ctx, HandleFromInput(ctx, 0), map);
}

bool SameConfig(const sce::KeyRowMapConfig& a, const sce::KeyRowMapConfig& b) {
  return a.capacity == b.capacity && a.admission_threshold == b.admission_threshold &&
         a.steps_to_live == b.steps_to_live && a.pending_capacity == b.pending_capacity;
}

class KeyRowMapOp : public OpKernel {
 public:
  explicit KeyRowMapOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("capacity", &config_.capacity));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("admission_threshold", &config_.admission_threshold));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("steps_to_live", &config_.steps_to_live));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("pending_capacity", &config_.pending_capacity));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateKeyRowMapConfig(Where(table_name_), config_)));
    OP_REQUIRES(ctx, !shared_name_.empty(),
                absl::InvalidArgumentError(Where(table_name_) + ": the key map needs a shared_name"));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    KeyRowMapResource* resource = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<KeyRowMapResource>(
                            container, shared_name_, &resource,
                            [this](KeyRowMapResource** created) -> absl::Status {
                              std::unique_ptr<sce::KeyRowMap> map;
                              TF_RETURN_IF_ERROR(ToTf(
                                  sce::KeyRowMap::Create(Where(table_name_), config_, &map)));
                              *created = new KeyRowMapResource(table_name_, std::move(map));
                              return absl::OkStatus();
                            }));
    core::ScopedUnref unref(resource);
    OP_REQUIRES(ctx,
                resource->table_name() == table_name_ &&
                    SameConfig(resource->map()->config(), config_),
                absl::InvalidArgumentError(absl::StrCat(
                    Where(table_name_), ": the key map '", shared_name_,
                    "' already exists with another table or configuration")));
    Tensor* handle = nullptr;
    AllocatorAttributes host;
    host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle, host));
    handle->scalar<ResourceHandle>()() =
        MakeResourceHandle<KeyRowMapResource>(ctx, container, shared_name_);
  }

 private:
  std::string container_, shared_name_, table_name_;
  sce::KeyRowMapConfig config_;
};

class KeyRowMapStepOp : public OpKernel {
 public:
  explicit KeyRowMapStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap(ctx, &resource));
    const Tensor& keys = ctx->input(1);
    const Tensor& step = ctx->input(2);
    const std::string where = Where(resource->table_name());
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                absl::InvalidArgumentError(absl::StrCat(where, ": keys must be a vector, got ",
                                                        keys.shape().DebugString())));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                absl::InvalidArgumentError(absl::StrCat(where, ": step must be a scalar, got ",
                                                        step.shape().DebugString())));
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    std::vector<uint64_t> new_keys;
    std::vector<int32_t> new_rows;
    sce::KeyRowMapStepStats stats;
    {
      mutex_lock lock(*resource->mu());
      OP_REQUIRES_OK(ctx, ToTf(resource->map()->MapStep(
                              step.scalar<int64_t>()(),
                              reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                              keys.NumElements(), rows->flat<int32_t>().data(), &new_keys,
                              &new_rows, &stats)));
    }
    Tensor* new_keys_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({static_cast<int64_t>(new_keys.size())}), &new_keys_out));
    std::copy(new_keys.begin(), new_keys.end(),
              reinterpret_cast<uint64_t*>(new_keys_out->flat<int64_t>().data()));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, new_rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, std::vector<int64_t>{
                                                 stats.admitted_keys, stats.evicted_keys,
                                                 stats.refused_keys, stats.unadmitted_ids,
                                                 stats.untracked_ids}));
  }
};

absl::Status OutputKeys(OpKernelContext* ctx, int index, const std::vector<uint64_t>& keys) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(index, TensorShape({static_cast<int64_t>(keys.size())}), &out));
  std::copy(keys.begin(), keys.end(), reinterpret_cast<uint64_t*>(out->flat<int64_t>().data()));
  return absl::OkStatus();
}

class KeyRowMapExportOp : public OpKernel {
 public:
  explicit KeyRowMapExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap(ctx, &resource));
    sce::KeyRowMapState state;
    {
      mutex_lock lock(*resource->mu());
      state = resource->map()->Export();
    }
    Tensor* last_step = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &last_step));
    last_step->scalar<int64_t>()() = state.last_step;
    OP_REQUIRES_OK(ctx, OutputKeys(ctx, 1, state.keys));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, state.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, state.last_seen));
    OP_REQUIRES_OK(ctx, OutputKeys(ctx, 4, state.pending_keys));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 5, state.pending_counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 6, state.pending_last_seen));
  }
};

template <typename In, typename Out>
absl::Status ReadVector(const Tensor& t, const std::string& where, const char* name,
                        std::vector<Out>* out) {
  if (!TensorShapeUtils::IsVector(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", name, " must be a vector, got ", t.shape().DebugString()));
  }
  const auto flat = t.flat<In>();
  out->assign(flat.data(), flat.data() + flat.size());
  return absl::OkStatus();
}

class KeyRowMapImportOp : public OpKernel {
 public:
  explicit KeyRowMapImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap(ctx, &resource));
    const std::string where = Where(resource->table_name());
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(1).shape()),
                absl::InvalidArgumentError(where + ": last_step must be a scalar"));
    sce::KeyRowMapState state;
    state.last_step = ctx->input(1).scalar<int64_t>()();
    OP_REQUIRES_OK(ctx, (ReadVector<int64_t, uint64_t>(ctx->input(2), where, "keys", &state.keys)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(3), where, "last_seen",
                                                      &state.last_seen)));
    OP_REQUIRES_OK(ctx, (ReadVector<int64_t, uint64_t>(ctx->input(4), where, "pending_keys",
                                                       &state.pending_keys)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(5), where, "pending_counts",
                                                      &state.pending_counts)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(6), where, "pending_last_seen",
                                                      &state.pending_last_seen)));
    mutex_lock lock(*resource->mu());
    OP_REQUIRES_OK(ctx, ToTf(resource->map()->Import(state)));
  }
};

class KeyRowMapSizeOp : public OpKernel {
 public:
  explicit KeyRowMapSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap(ctx, &resource));
    mutex_lock lock(*resource->mu());
    const sce::KeyRowMap& map = *resource->map();
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, std::vector<int64_t>{map.size(), map.pending_size(),
                                                                   map.last_step()}));
  }
};

REGISTER_KERNEL_BUILDER(Name("SceKeyRowMap").Device(DEVICE_CPU), KeyRowMapOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapStep").Device(DEVICE_CPU), KeyRowMapStepOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapExport").Device(DEVICE_CPU), KeyRowMapExportOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapImport").Device(DEVICE_CPU), KeyRowMapImportOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapSize").Device(DEVICE_CPU), KeyRowMapSizeOp);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
