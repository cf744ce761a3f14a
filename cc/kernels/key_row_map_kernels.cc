// Kernels of the key-to-row map ops (cc/ops/key_row_map_ops.cc): a ResourceBase that owns one
// shard's map (int64 or string keys) behind a mutex, and thin adapters that check tensor shapes
// and hand the buffers to the core.
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "cc/core/key_grouping.h"
#include "cc/core/key_row_map.h"
#include "cc/core/key_values.h"
#include "cc/core/string_key_row_map.h"
#include "cc/kernels/kernel_utils.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tensorflow {
namespace sce_kernels {
namespace {

std::string Where(const std::string& table_name) { return "table '" + table_name + "'"; }

// One shard's map (sce::KeyRowMap for int64 keys, sce::StringKeyRowMap for strings) behind a
// mutex.
template <typename Map>
class MapResource : public ResourceBase {
 public:
  MapResource(std::string table_name, std::unique_ptr<Map> map)
      : table_name_(std::move(table_name)), map_(std::move(map)) {}

  std::string DebugString() const override {
    return "key-to-row map of " + Where(table_name_);
  }
  int64_t MemoryUsed() const override { return map_->MemoryBytes(); }

  mutex* mu() { return &mu_; }
  const std::string& table_name() const { return table_name_; }
  Map* map() { return map_.get(); }
  const sce::KeyRowMapConfig& config() const { return KeyMap().config(); }
  const sce::KeyRowMap& KeyMap() const;

 private:
  const std::string table_name_;
  mutex mu_;
  std::unique_ptr<Map> map_;
};

template <>
const sce::KeyRowMap& MapResource<sce::KeyRowMap>::KeyMap() const { return *map_; }
template <>
const sce::KeyRowMap& MapResource<sce::StringKeyRowMap>::KeyMap() const {
  return map_->key_map();
}

using KeyRowMapResource = MapResource<sce::KeyRowMap>;
using StringKeyRowMapResource = MapResource<sce::StringKeyRowMap>;

template <typename Map>
absl::Status LookupMap(OpKernelContext* ctx, core::RefCountPtr<MapResource<Map>>* map) {
  return LookupResource(ctx, HandleFromInput(ctx, 0), map);
}

bool SameConfig(const sce::KeyRowMapConfig& a, const sce::KeyRowMapConfig& b) {
  return a.capacity == b.capacity && a.admission_threshold == b.admission_threshold &&
         a.steps_to_live == b.steps_to_live && a.pending_capacity == b.pending_capacity &&
         a.total_rows == b.total_rows && a.first_row == b.first_row;
}

template <typename Map>
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("total_rows", &config_.total_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_row", &config_.first_row));
    OP_REQUIRES_OK(ctx, ToTf(sce::ValidateKeyRowMapConfig(Where(table_name_), config_)));
    OP_REQUIRES(ctx, !shared_name_.empty(),
                absl::InvalidArgumentError(Where(table_name_) + ": the key map needs a shared_name"));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string container =
        container_.empty() ? ctx->resource_manager()->default_container() : container_;
    MapResource<Map>* resource = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<MapResource<Map>>(
                            container, shared_name_, &resource,
                            [this](MapResource<Map>** created) -> absl::Status {
                              std::unique_ptr<Map> map;
                              TF_RETURN_IF_ERROR(
                                  ToTf(Map::Create(Where(table_name_), config_, &map)));
                              *created = new MapResource<Map>(table_name_, std::move(map));
                              return absl::OkStatus();
                            }));
    core::ScopedUnref unref(resource);
    OP_REQUIRES(ctx,
                resource->table_name() == table_name_ &&
                    SameConfig(resource->config(), config_),
                absl::InvalidArgumentError(absl::StrCat(
                    Where(table_name_), ": the key map '", shared_name_,
                    "' already exists with another table or configuration")));
    Tensor* handle = nullptr;
    AllocatorAttributes host;
    host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle, host));
    handle->scalar<ResourceHandle>()() =
        MakeResourceHandle<MapResource<Map>>(ctx, container, shared_name_);
  }

 private:
  std::string container_, shared_name_, table_name_;
  sce::KeyRowMapConfig config_;
};

sce::KeyRowMap* KeyMapOf(sce::KeyRowMap* map) { return map; }
sce::KeyRowMap* KeyMapOf(sce::StringKeyRowMap* map) { return map->mutable_key_map(); }

absl::Status OutputStats(OpKernelContext* ctx, int index, const sce::KeyRowMapStepStats& stats,
                         const int64_t* collided = nullptr) {
  std::vector<int64_t> values{stats.admitted_keys, stats.evicted_keys, stats.refused_keys,
                              stats.unadmitted_ids, stats.untracked_ids};
  if (collided != nullptr) values.push_back(*collided);
  return OutputVector(ctx, index, values);
}

class KeyRowMapStepOp : public OpKernel {
 public:
  explicit KeyRowMapStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wait", &wait_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::KeyRowMap>(ctx, &resource));
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
      sce::KeyRowMap* map = resource->map();
      int32_t* answers = rows->flat<int32_t>().data();
      // Waiting, the occurrences FinishStep answers are left as they are: defined here.
      if (wait_) std::fill(answers, answers + keys.NumElements(), sce::kNoRow);
      OP_REQUIRES_OK(ctx, ToTf(map->MapStep(
                              step.scalar<int64_t>()(),
                              reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                              keys.NumElements(), answers, &new_keys, &new_rows, &stats, wait_)));
      if (!wait_) map->ToTableRows(answers, keys.NumElements());
      map->ToTableRows(new_rows.data(), static_cast<int64_t>(new_rows.size()));
    }
    Tensor* new_keys_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({static_cast<int64_t>(new_keys.size())}), &new_keys_out));
    std::copy(new_keys.begin(), new_keys.end(),
              reinterpret_cast<uint64_t*>(new_keys_out->flat<int64_t>().data()));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, new_rows));
    OP_REQUIRES_OK(ctx, OutputStats(ctx, 3, stats));
  }

 private:
  bool wait_ = false;
};

// Lending between shards (KeyRowMap::FreeRows / waiting_keys / LendRows).
template <typename Map>
class LendableOp : public OpKernel {
 public:
  explicit LendableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    int64_t waiting = 0, free = 0;
    {
      mutex_lock lock(*resource->mu());
      sce::KeyRowMap* map = KeyMapOf(resource->map());
      sce::KeyRowMapStepStats swept;
      waiting = map->waiting_keys();
      free = map->FreeRows(&swept);
    }
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, std::vector<int64_t>{waiting, free}));
  }
};

template <typename Map>
class LendRowsOp : public OpKernel {
 public:
  explicit LendRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    const Tensor& count = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(count.shape()),
                absl::InvalidArgumentError(absl::StrCat(Where(resource->table_name()),
                                                        ": count must be a scalar, got ",
                                                        count.shape().DebugString())));
    std::vector<int32_t> rows;
    {
      mutex_lock lock(*resource->mu());
      OP_REQUIRES_OK(ctx, ToTf(KeyMapOf(resource->map())->LendRows(count.scalar<int64_t>()(),
                                                                   &rows)));
    }
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, rows));
  }
};

// Checks FinishStep's inputs: lent rows, keys and the rows of Step(wait=true), one per key.
absl::Status CheckFinishInputs(const std::string& where, const Tensor& lent, const Tensor& keys,
                               const Tensor& rows) {
  if (!TensorShapeUtils::IsVector(lent.shape()) || !TensorShapeUtils::IsVector(keys.shape()) ||
      rows.shape() != keys.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": lent rows, keys and rows must be vectors, the last two of one length; got ",
        lent.shape().DebugString(), ", ", keys.shape().DebugString(), " and ",
        rows.shape().DebugString()));
  }
  return absl::OkStatus();
}

class KeyRowMapFinishStepOp : public OpKernel {
 public:
  explicit KeyRowMapFinishStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::KeyRowMap>(ctx, &resource));
    const Tensor& lent = ctx->input(1);
    const Tensor& keys = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckFinishInputs(Where(resource->table_name()), lent, keys,
                                          ctx->input(3)));
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    const auto given = ctx->input(3).flat<int32_t>();
    int32_t* answers = rows->flat<int32_t>().data();
    std::copy(given.data(), given.data() + given.size(), answers);
    std::vector<uint64_t> new_keys;
    std::vector<int32_t> new_rows;
    sce::KeyRowMapStepStats stats;
    {
      mutex_lock lock(*resource->mu());
      sce::KeyRowMap* map = resource->map();
      OP_REQUIRES_OK(ctx, ToTf(map->FinishStep(
                              lent.flat<int32_t>().data(), lent.NumElements(),
                              reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                              keys.NumElements(), answers, &new_keys, &new_rows, &stats)));
      map->ToTableRows(answers, keys.NumElements());
      map->ToTableRows(new_rows.data(), static_cast<int64_t>(new_rows.size()));
    }
    Tensor* new_keys_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({static_cast<int64_t>(new_keys.size())}), &new_keys_out));
    std::copy(new_keys.begin(), new_keys.end(),
              reinterpret_cast<uint64_t*>(new_keys_out->flat<int64_t>().data()));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, new_rows));
    OP_REQUIRES_OK(ctx, OutputStats(ctx, 3, stats));
  }
};

// The rows to reset, and their confirmation (KeyRowMap::rows_to_reset / ConfirmReset).
template <typename Map>
class RowsToResetOp : public OpKernel {
 public:
  explicit RowsToResetOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    std::vector<int32_t> rows;
    std::vector<int64_t> keys;
    {
      tf_shared_lock lock(*resource->mu());
      const sce::KeyRowMap* map = KeyMapOf(resource->map());
      rows = map->rows_to_reset();
      map->ToTableRows(rows.data(), static_cast<int64_t>(rows.size()));
      keys.assign(map->keys_to_reset().begin(), map->keys_to_reset().end());
    }
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, keys));
  }
};

template <typename Map>
class ConfirmResetOp : public OpKernel {
 public:
  explicit ConfirmResetOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    const Tensor& count = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(count.shape()),
                absl::InvalidArgumentError(absl::StrCat(Where(resource->table_name()),
                                                        ": count must be a scalar, got ",
                                                        count.shape().DebugString())));
    mutex_lock lock(*resource->mu());
    KeyMapOf(resource->map())->ConfirmReset(count.scalar<int32_t>()());
  }
};

// The distinct rows of the last step (KeyRowMap::NumberStepRows). It writes each numbered row's
// metadata and restores it before returning, so it holds the map's exclusive lock.
template <typename Map>
class NumberRowsOp : public OpKernel {
 public:
  explicit NumberRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    const Tensor& rows = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(rows.shape()),
                absl::InvalidArgumentError(absl::StrCat(Where(resource->table_name()),
                                                        ": rows must be a vector, got ",
                                                        rows.shape().DebugString())));
    Tensor* positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, rows.shape(), &positions));
    std::vector<int32_t> unique_rows;
    {
      mutex_lock lock(*resource->mu());
      const sce::KeyRowMap& map = resource->KeyMap();
      // Its rows are then the map's own numbering: the answers need no translation.
      OP_REQUIRES(ctx, map.config().first_row == 0 && map.local_rows() == map.config().capacity,
                  absl::InvalidArgumentError(absl::StrCat(
                      Where(resource->table_name()),
                      ": numbering rows needs a map that holds its own rows only")));
      OP_REQUIRES_OK(ctx, ToTf(KeyMapOf(resource->map())->NumberStepRows(
                              rows.flat<int32_t>().data(), rows.NumElements(),
                              positions->flat<int32_t>().data(), &unique_rows)));
    }
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, unique_rows));
  }
};

// Read-only lookups: under a shared lock, the map unchanged.
class KeyRowMapFindOp : public OpKernel {
 public:
  explicit KeyRowMapFindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::KeyRowMap>(ctx, &resource));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                absl::InvalidArgumentError(absl::StrCat(Where(resource->table_name()),
                                                        ": keys must be a vector, got ",
                                                        keys.shape().DebugString())));
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    tf_shared_lock lock(*resource->mu());
    resource->map()->Find(reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                          keys.NumElements(), rows->flat<int32_t>().data());
    resource->map()->ToTableRows(rows->flat<int32_t>().data(), keys.NumElements());
  }
};

class StringKeyRowMapFindOp : public OpKernel {
 public:
  explicit StringKeyRowMapFindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<StringKeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::StringKeyRowMap>(ctx, &resource));
    const Tensor& keys = ctx->input(1);
    const Tensor& fingerprints = ctx->input(2);
    OP_REQUIRES(ctx,
                TensorShapeUtils::IsVector(keys.shape()) && fingerprints.shape() == keys.shape(),
                absl::InvalidArgumentError(absl::StrCat(
                    Where(resource->table_name()),
                    ": keys and fingerprints must be vectors of one length, got ",
                    keys.shape().DebugString(), " and ", fingerprints.shape().DebugString())));
    const auto key_strings = keys.flat<tstring>();
    std::vector<std::string_view> views(key_strings.size());
    for (int64_t i = 0; i < key_strings.size(); ++i) {
      views[i] = std::string_view(key_strings(i).data(), key_strings(i).size());
    }
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    tf_shared_lock lock(*resource->mu());
    resource->map()->Find(views.data(),
                          reinterpret_cast<const uint64_t*>(fingerprints.flat<int64_t>().data()),
                          keys.NumElements(), rows->flat<int32_t>().data());
    resource->KeyMap().ToTableRows(rows->flat<int32_t>().data(), keys.NumElements());
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
    OP_REQUIRES_OK(ctx, LookupMap<sce::KeyRowMap>(ctx, &resource));
    sce::KeyRowMapState state;
    {
      mutex_lock lock(*resource->mu());
      state = resource->map()->Export();
      resource->map()->ToTableRows(state.rows.data(), static_cast<int64_t>(state.rows.size()));
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

// Reads an import's placement (inputs `first`, `first + 1`) when the op has placed=true.
absl::Status ReadPlacement(OpKernelContext* ctx, int first, const std::string& where,
                           sce::KeyRowMapPlacement* placement) {
  TF_RETURN_IF_ERROR((ReadVector<int32_t, int32_t>(ctx->input(first), where, "placement_rows",
                                                   &placement->rows)));
  return ReadVector<int32_t, int32_t>(ctx->input(first + 1), where, "lent_rows",
                                      &placement->lent_rows);
}

class KeyRowMapImportOp : public OpKernel {
 public:
  explicit KeyRowMapImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("placed", &placed_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<KeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::KeyRowMap>(ctx, &resource));
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
    sce::KeyRowMapPlacement placement;
    OP_REQUIRES_OK(ctx, ReadPlacement(ctx, 7, where, &placement));
    mutex_lock lock(*resource->mu());
    OP_REQUIRES_OK(ctx, ToTf(resource->map()->Import(state, placed_ ? &placement : nullptr)));
  }

 private:
  bool placed_ = false;
};

template <typename Map>
class KeyRowMapSizeOp : public OpKernel {
 public:
  explicit KeyRowMapSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<MapResource<Map>> resource;
    OP_REQUIRES_OK(ctx, LookupMap<Map>(ctx, &resource));
    mutex_lock lock(*resource->mu());
    const sce::KeyRowMap& map = resource->KeyMap();
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, std::vector<int64_t>{map.size(), map.pending_size(),
                                                                   map.last_step()}));
  }
};

// ---- String keys -------------------------------------------------------------------------

// The string views of a vector of keys (valid while the tensor lives).
std::vector<std::string_view> StringViews(const Tensor& keys) {
  const auto key_strings = keys.flat<tstring>();
  std::vector<std::string_view> views(key_strings.size());
  for (int64_t i = 0; i < key_strings.size(); ++i) {
    views[i] = std::string_view(key_strings(i).data(), key_strings(i).size());
  }
  return views;
}

absl::Status CheckStringKeys(const std::string& where, const Tensor& keys,
                             const Tensor& fingerprints) {
  if (!TensorShapeUtils::IsVector(keys.shape()) || fingerprints.shape() != keys.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": keys and fingerprints must be vectors of one length, got ",
        keys.shape().DebugString(), " and ", fingerprints.shape().DebugString()));
  }
  return absl::OkStatus();
}

// new_keys (the strings given rows) and new_rows (as rows of the whole table), outputs 1 and 2.
absl::Status OutputNewStrings(OpKernelContext* ctx, const std::vector<std::string>& new_keys,
                              const std::vector<int32_t>& new_rows) {
  Tensor* new_keys_out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      1, TensorShape({static_cast<int64_t>(new_keys.size())}), &new_keys_out));
  for (size_t i = 0; i < new_keys.size(); ++i) new_keys_out->flat<tstring>()(i) = new_keys[i];
  return OutputVector(ctx, 2, new_rows);
}

class StringKeyRowMapStepOp : public OpKernel {
 public:
  explicit StringKeyRowMapStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wait", &wait_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<StringKeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::StringKeyRowMap>(ctx, &resource));
    const Tensor& keys = ctx->input(1);
    const Tensor& fingerprints = ctx->input(2);
    const Tensor& step = ctx->input(3);
    const std::string where = Where(resource->table_name());
    OP_REQUIRES_OK(ctx, CheckStringKeys(where, keys, fingerprints));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step.shape()),
                absl::InvalidArgumentError(absl::StrCat(where, ": step must be a scalar, got ",
                                                        step.shape().DebugString())));
    const std::vector<std::string_view> views = StringViews(keys);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    int32_t* answers = rows->flat<int32_t>().data();
    if (wait_) std::fill(answers, answers + keys.NumElements(), sce::kNoRow);
    std::vector<int32_t> new_rows;
    std::vector<std::string> new_keys;
    sce::KeyRowMapStepStats stats;
    int64_t collided = 0;
    {
      mutex_lock lock(*resource->mu());
      sce::StringKeyRowMap* map = resource->map();
      OP_REQUIRES_OK(
          ctx, ToTf(map->MapStep(
                   step.scalar<int64_t>()(), views.data(),
                   reinterpret_cast<const uint64_t*>(fingerprints.flat<int64_t>().data()),
                   keys.NumElements(), answers, &new_rows, &stats, &collided, wait_)));
      // Waiting: the strings are matched to rows (and new_keys known) in FinishStep.
      if (!wait_) {
        for (int32_t row : new_rows) new_keys.push_back(map->row_key(row));
        map->key_map().ToTableRows(answers, keys.NumElements());
        map->key_map().ToTableRows(new_rows.data(), static_cast<int64_t>(new_rows.size()));
      } else {
        new_rows.clear();
      }
    }
    OP_REQUIRES_OK(ctx, OutputNewStrings(ctx, new_keys, new_rows));
    OP_REQUIRES_OK(ctx, OutputStats(ctx, 3, stats, &collided));
  }

 private:
  bool wait_ = false;
};

class StringKeyRowMapFinishStepOp : public OpKernel {
 public:
  explicit StringKeyRowMapFinishStepOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<StringKeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::StringKeyRowMap>(ctx, &resource));
    const Tensor& lent = ctx->input(1);
    const Tensor& keys = ctx->input(2);
    const Tensor& fingerprints = ctx->input(3);
    const std::string where = Where(resource->table_name());
    OP_REQUIRES_OK(ctx, CheckStringKeys(where, keys, fingerprints));
    OP_REQUIRES_OK(ctx, CheckFinishInputs(where, lent, keys, ctx->input(4)));
    const std::vector<std::string_view> views = StringViews(keys);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    const auto given = ctx->input(4).flat<int32_t>();
    int32_t* answers = rows->flat<int32_t>().data();
    std::copy(given.data(), given.data() + given.size(), answers);
    std::vector<int32_t> new_rows;
    std::vector<std::string> new_keys;
    sce::KeyRowMapStepStats stats;
    int64_t collided = 0;
    {
      mutex_lock lock(*resource->mu());
      sce::StringKeyRowMap* map = resource->map();
      OP_REQUIRES_OK(
          ctx, ToTf(map->FinishStep(
                   lent.flat<int32_t>().data(), lent.NumElements(), views.data(),
                   reinterpret_cast<const uint64_t*>(fingerprints.flat<int64_t>().data()),
                   keys.NumElements(), answers, &new_rows, &stats, &collided)));
      for (int32_t row : new_rows) new_keys.push_back(map->row_key(row));
      map->key_map().ToTableRows(answers, keys.NumElements());
      map->key_map().ToTableRows(new_rows.data(), static_cast<int64_t>(new_rows.size()));
    }
    OP_REQUIRES_OK(ctx, OutputNewStrings(ctx, new_keys, new_rows));
    OP_REQUIRES_OK(ctx, OutputStats(ctx, 3, stats, &collided));
  }
};

absl::Status OutputStrings(OpKernelContext* ctx, int index, const std::vector<std::string>& keys) {
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(index, TensorShape({static_cast<int64_t>(keys.size())}), &out));
  for (size_t i = 0; i < keys.size(); ++i) out->flat<tstring>()(i) = keys[i];
  return absl::OkStatus();
}

class StringKeyRowMapExportOp : public OpKernel {
 public:
  explicit StringKeyRowMapExportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<StringKeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::StringKeyRowMap>(ctx, &resource));
    sce::StringKeyRowMapState state;
    {
      mutex_lock lock(*resource->mu());
      state = resource->map()->Export();
      resource->KeyMap().ToTableRows(state.rows.data(), static_cast<int64_t>(state.rows.size()));
    }
    Tensor* last_step = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &last_step));
    last_step->scalar<int64_t>()() = state.last_step;
    OP_REQUIRES_OK(ctx, OutputStrings(ctx, 1, state.keys));
    OP_REQUIRES_OK(ctx, OutputKeys(ctx, 2, state.fingerprints));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, state.rows));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 4, state.last_seen));
    OP_REQUIRES_OK(ctx, OutputKeys(ctx, 5, state.pending_fingerprints));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 6, state.pending_counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 7, state.pending_last_seen));
  }
};

class StringKeyRowMapImportOp : public OpKernel {
 public:
  explicit StringKeyRowMapImportOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("placed", &placed_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<StringKeyRowMapResource> resource;
    OP_REQUIRES_OK(ctx, LookupMap<sce::StringKeyRowMap>(ctx, &resource));
    const std::string where = Where(resource->table_name());
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(1).shape()),
                absl::InvalidArgumentError(where + ": last_step must be a scalar"));
    sce::StringKeyRowMapState state;
    state.last_step = ctx->input(1).scalar<int64_t>()();
    const Tensor& keys = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                absl::InvalidArgumentError(where + ": keys must be a vector"));
    for (int64_t i = 0; i < keys.NumElements(); ++i) {
      const tstring& key = keys.flat<tstring>()(i);
      state.keys.emplace_back(key.data(), key.size());
    }
    OP_REQUIRES_OK(ctx, (ReadVector<int64_t, uint64_t>(ctx->input(3), where, "fingerprints",
                                                       &state.fingerprints)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(4), where, "last_seen",
                                                      &state.last_seen)));
    OP_REQUIRES_OK(ctx, (ReadVector<int64_t, uint64_t>(ctx->input(5), where,
                                                       "pending_fingerprints",
                                                       &state.pending_fingerprints)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(6), where, "pending_counts",
                                                      &state.pending_counts)));
    OP_REQUIRES_OK(ctx, (ReadVector<int32_t, int32_t>(ctx->input(7), where, "pending_last_seen",
                                                      &state.pending_last_seen)));
    sce::KeyRowMapPlacement placement;
    OP_REQUIRES_OK(ctx, ReadPlacement(ctx, 8, where, &placement));
    mutex_lock lock(*resource->mu());
    OP_REQUIRES_OK(ctx, ToTf(resource->map()->Import(state, placed_ ? &placement : nullptr)));
  }

 private:
  bool placed_ = false;
};

// SceKeyOwnerShards: the owner shard of each key.
class KeyOwnerShardsOp : public OpKernel {
 public:
  explicit KeyOwnerShardsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES(ctx, num_shards_ >= 1,
                errors::InvalidArgument("SceKeyOwnerShards: num_shards must be >= 1, got ",
                                        num_shards_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                errors::InvalidArgument("SceKeyOwnerShards: keys must be a vector, got ",
                                        keys.shape().DebugString()));
    Tensor* owners = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &owners));
    sce::KeyOwnerShards(reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                        keys.NumElements(), num_shards_, owners->flat<int32_t>().data());
  }

 private:
  int32_t num_shards_ = 1;
};

// What the key exchange's ops name in errors: their optional table_name attribute's table, else
// the op.
absl::Status WhereFromAttr(OpKernelConstruction* ctx, std::string* where) {
  std::string table_name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &table_name));
  *where = table_name.empty() ? ctx->def().op() : Where(table_name);
  return absl::OkStatus();
}

// SceGroupKeysByOwner: a replica's distinct keys of one table, grouped by owner shard.
class GroupKeysByOwnerOp : public OpKernel {
 public:
  explicit GroupKeysByOwnerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, WhereFromAttr(ctx, &where_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                absl::InvalidArgumentError(absl::StrCat(where_, ": keys must be a vector, got ",
                                                        keys.shape().DebugString())));
    Tensor* positions = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, keys.shape(), &positions));
    sce::KeysByOwner grouped;
    OP_REQUIRES_OK(ctx, ToTf(sce::GroupKeysByOwner(
                            where_, reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                            keys.NumElements(), num_shards_, positions->flat<int32_t>().data(),
                            &grouped)));
    Tensor* grouped_keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(grouped.keys.size())}),
                            &grouped_keys));
    std::copy(grouped.keys.begin(), grouped.keys.end(),
              reinterpret_cast<uint64_t*>(grouped_keys->flat<int64_t>().data()));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 1, grouped.occurrences));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 2, grouped.owner_counts));
  }

 private:
  int64_t num_shards_ = 1;
  std::string where_;
};

// SceRepeatIndices: the key index of every occurrence, from the keys' occurrence counts.
class RepeatIndicesOp : public OpKernel {
 public:
  explicit RepeatIndicesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, WhereFromAttr(ctx, &where_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& counts = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(counts.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    where_, ": counts must be a vector, got ", counts.shape().DebugString())));
    std::vector<int32_t> indices;
    OP_REQUIRES_OK(ctx, ToTf(sce::RepeatIndices(where_, counts.flat<int32_t>().data(),
                                                counts.NumElements(), &indices)));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 0, indices));
  }

 private:
  std::string where_;
};

// SceKeyedRandomRows: [n, width] initial values of (seed, key, column).
class KeyedRandomRowsOp : public OpKernel {
 public:
  explicit KeyedRandomRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width_));
    OP_REQUIRES(ctx, width_ >= 0,
                errors::InvalidArgument("SceKeyedRandomRows: width must be >= 0, got ", width_));
    std::string distribution;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distribution", &distribution));
    distribution_ = distribution == "uniform"  ? sce::KeyedDistribution::kUniform
                    : distribution == "normal" ? sce::KeyedDistribution::kNormal
                                               : sce::KeyedDistribution::kTruncatedNormal;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("a", &a_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("b", &b_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                errors::InvalidArgument("SceKeyedRandomRows: keys must be a vector, got ",
                                        keys.shape().DebugString()));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({keys.dim_size(0), width_}, &shape));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    sce::KeyedRandomRows(static_cast<uint64_t>(seed_),
                         reinterpret_cast<const uint64_t*>(keys.flat<int64_t>().data()),
                         keys.dim_size(0), width_, distribution_, a_, b_,
                         out->flat<float>().data());
  }

 private:
  int64_t seed_ = 0;
  int64_t width_ = 0;
  sce::KeyedDistribution distribution_ = sce::KeyedDistribution::kUniform;
  float a_ = 0.0f;
  float b_ = 1.0f;
};

REGISTER_KERNEL_BUILDER(Name("SceKeyOwnerShards").Device(DEVICE_CPU), KeyOwnerShardsOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyedRandomRows").Device(DEVICE_CPU), KeyedRandomRowsOp);
REGISTER_KERNEL_BUILDER(Name("SceGroupKeysByOwner").Device(DEVICE_CPU), GroupKeysByOwnerOp);
REGISTER_KERNEL_BUILDER(Name("SceRepeatIndices").Device(DEVICE_CPU), RepeatIndicesOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMap").Device(DEVICE_CPU), KeyRowMapOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapStep").Device(DEVICE_CPU), KeyRowMapStepOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapFinishStep").Device(DEVICE_CPU), KeyRowMapFinishStepOp);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapFinishStep").Device(DEVICE_CPU),
                        StringKeyRowMapFinishStepOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapLendable").Device(DEVICE_CPU),
                        LendableOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapLendable").Device(DEVICE_CPU),
                        LendableOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapLendRows").Device(DEVICE_CPU),
                        LendRowsOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapLendRows").Device(DEVICE_CPU),
                        LendRowsOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapExport").Device(DEVICE_CPU), KeyRowMapExportOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapFind").Device(DEVICE_CPU), KeyRowMapFindOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapRowsToReset").Device(DEVICE_CPU),
                        RowsToResetOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapConfirmReset").Device(DEVICE_CPU),
                        ConfirmResetOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapRowsToReset").Device(DEVICE_CPU),
                        RowsToResetOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapConfirmReset").Device(DEVICE_CPU),
                        ConfirmResetOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapNumberRows").Device(DEVICE_CPU),
                        NumberRowsOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapNumberRows").Device(DEVICE_CPU),
                        NumberRowsOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapFind").Device(DEVICE_CPU),
                        StringKeyRowMapFindOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapImport").Device(DEVICE_CPU), KeyRowMapImportOp);
REGISTER_KERNEL_BUILDER(Name("SceKeyRowMapSize").Device(DEVICE_CPU),
                        KeyRowMapSizeOp<sce::KeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMap").Device(DEVICE_CPU),
                        KeyRowMapOp<sce::StringKeyRowMap>);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapStep").Device(DEVICE_CPU),
                        StringKeyRowMapStepOp);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapExport").Device(DEVICE_CPU),
                        StringKeyRowMapExportOp);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapImport").Device(DEVICE_CPU),
                        StringKeyRowMapImportOp);
REGISTER_KERNEL_BUILDER(Name("SceStringKeyRowMapSize").Device(DEVICE_CPU),
                        KeyRowMapSizeOp<sce::StringKeyRowMap>);

}  // namespace
}  // namespace sce_kernels
}  // namespace tensorflow
