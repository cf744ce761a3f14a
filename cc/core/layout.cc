#include "cc/core/layout.h"

#include <algorithm>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"

namespace sce {

LayoutStacker::LayoutStacker(int64_t num_partitions, int64_t sparse_cores_per_partition,
                             bool disable_table_stacking, StackerLimits limits)
    : num_partitions_(num_partitions),
      sparse_cores_per_partition_(sparse_cores_per_partition),
      num_sparse_cores_(0),
      stacking_enabled_(!disable_table_stacking),
      limits_(limits) {
  // Checked here, reported by AddTable: a constructor cannot return a Status.
  if (num_partitions < 1 || sparse_cores_per_partition < 1) {
    config_error_ = InvalidArgument("the stacker needs at least one partition and one SparseCore");
    return;
  }
  const std::string where = "the layout stacker";
  config_error_ = CheckInRange(where, "num_partitions", num_partitions, 1, kMaxReplicas);
  if (config_error_.ok()) {
    config_error_ = CheckInRange(where, "sparse_cores_per_partition", sparse_cores_per_partition, 1,
                                 kMaxSparseCoresPerChip);
  }
  if (config_error_.ok()) {
    config_error_ = CheckedSize(where, "num_partitions * sparse_cores_per_partition",
                                {num_partitions, sparse_cores_per_partition}, kMaxShards,
                                &num_sparse_cores_);
  }
  if (config_error_.ok() && (limits.activation_mem_bytes < 0 || limits.variable_shard_bytes < 0 ||
                             limits.rows < 1 || limits.tables < 1)) {
    config_error_ = InvalidArgument(where, ": the stacking limits must be >= 0");
  }
}

Status LayoutStacker::AddTable(const std::string& name, int64_t height, int64_t width,
                               const std::string& group, int64_t output_samples,
                               int64_t num_features) {
  if (!config_error_.ok()) return config_error_;
  if (height < 1 || width < 1) {
    return InvalidArgument("table '", name, "': vocabulary size and dim must be >= 1, got ", height,
                           " x ", width);
  }
  if (output_samples < 0 || num_features < 0) {
    return InvalidArgument("table '", name, "': output_samples and num_features must be >= 0");
  }
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
    return InvalidArgument("table '", name, "' was added twice");
  }
  const int64_t n = num_sparse_cores_;
  TableLayout layout;
  layout.table_name = name;
  layout.num_sparse_cores = n;
  layout.num_partitions = num_partitions_;
  layout.height = height;
  layout.width = width;
  const std::string where = "table '" + name + "'";
  // Padding, byte counts and stack sums are formed with checked arithmetic: a vocabulary or width
  // near 2^63 is an error, never a wrapped-around (and then accepted) size.
  if (!CheckedRoundUp(width, kXlaPadSize, &layout.padded_width)) {
    return InvalidArgument(where, ": dim ", width, " overflows when padded to a multiple of ",
                           kXlaPadSize);
  }
  if (!CheckedRoundUp(height, n * kXlaPadSize, &layout.padded_height)) {
    return InvalidArgument(where, ": vocabulary size ", height,
                           " overflows when padded to a multiple of ", n * kXlaPadSize);
  }
  layout.per_sparse_core_batch_size = output_samples / sparse_cores_per_partition_;
  layout.num_features = num_features;
  if (layout.padded_height > limits_.rows) {
    return InvalidArgument("table '", name, "' has ", layout.padded_height,
                           " padded rows, more than the limit of ", limits_.rows);
  }
  int64_t activation_bytes, variable_bytes;
  if (!CheckedProduct({4, layout.padded_width, layout.per_sparse_core_batch_size},
                      &activation_bytes)) {
    return InvalidArgument(where, ": the activation size (4 bytes x padded dim ",
                           layout.padded_width, " x ", layout.per_sparse_core_batch_size,
                           " samples per SparseCore) overflows");
  }
  if (!CheckedProduct({4, layout.padded_width, layout.padded_height}, &variable_bytes)) {
    return InvalidArgument(where, ": the table size (4 bytes x ", layout.padded_height, " x ",
                           layout.padded_width, ") overflows");
  }
  variable_bytes /= num_partitions_;

  std::vector<Stack>& candidates = stacks_[{layout.padded_width, group}];
  Stack* target = nullptr;
  if (stacking_enabled_) {
    for (Stack& stack : candidates) {
      const bool fits =
          static_cast<int64_t>(stack.tables.size()) < limits_.tables &&
          (limits_.activation_mem_bytes == 0 ||
           SaturatingAdd(stack.activation_bytes, activation_bytes) <
               limits_.activation_mem_bytes) &&
          (limits_.variable_shard_bytes == 0 ||
           SaturatingAdd(stack.variable_bytes, variable_bytes) < limits_.variable_shard_bytes) &&
          SaturatingAdd(stack.height, layout.padded_height) < limits_.rows;
      if (fits) {
        target = &stack;
        break;
      }
    }
  }
  if (target == nullptr) {
    candidates.emplace_back();
    target = &candidates.back();
  }
  const int64_t position = static_cast<int64_t>(target->tables.size());
  layout.sparse_core_shard_row_offset = target->height / n;
  // (position * sparse_cores_per_partition) mod n without forming the product.
  layout.sparse_core_shard_rotation =
      static_cast<int64_t>((static_cast<unsigned __int128>(position) *
                            static_cast<unsigned __int128>(sparse_cores_per_partition_)) %
                           static_cast<unsigned __int128>(n));
  target->tables.push_back(layout);
  target->height += layout.padded_height;
  target->activation_bytes = SaturatingAdd(target->activation_bytes, activation_bytes);
  target->variable_bytes = SaturatingAdd(target->variable_bytes, variable_bytes);
  names_.push_back(name);
  return Status::Ok();
}

std::vector<TableLayout> LayoutStacker::GetLayouts() const {
  std::vector<TableLayout> layouts;
  for (const auto& [key, stacks] : stacks_) {
    for (const Stack& stack : stacks) {
      std::string stacked_name;
      for (const TableLayout& t : stack.tables) {
        stacked_name += (stacked_name.empty() ? "" : "_") + t.table_name;
      }
      for (TableLayout t : stack.tables) {
        t.stacked_table_name = stacked_name;
        t.total_rows_per_sparse_core_shard = stack.height / num_sparse_cores_;
        layouts.push_back(t);
      }
    }
  }
  return layouts;
}

}  // namespace sce
