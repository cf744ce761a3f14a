#include "cc/core/layout.h"

#include <algorithm>

#include "cc/core/constants.h"

namespace sce {

LayoutStacker::LayoutStacker(int64_t num_partitions, int64_t sparse_cores_per_partition,
                             bool disable_table_stacking, StackerLimits limits)
    : num_partitions_(num_partitions),
      sparse_cores_per_partition_(sparse_cores_per_partition),
      num_sparse_cores_(num_partitions * sparse_cores_per_partition),
      stacking_enabled_(!disable_table_stacking),
      limits_(limits) {}

Status LayoutStacker::AddTable(const std::string& name, int64_t height, int64_t width,
                               const std::string& group, int64_t output_samples,
                               int64_t num_features) {
  if (num_partitions_ < 1 || sparse_cores_per_partition_ < 1) {
    return InvalidArgument("the stacker needs at least one partition and one SparseCore");
  }
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
  layout.padded_width = RoundUp(width, kXlaPadSize);
  layout.padded_height = RoundUp(height, n * kXlaPadSize);
  layout.per_sparse_core_batch_size = output_samples / sparse_cores_per_partition_;
  layout.num_features = num_features;
  const int64_t activation_bytes = 4 * layout.padded_width * layout.per_sparse_core_batch_size;
  const int64_t variable_bytes = 4 * layout.padded_width * layout.padded_height / num_partitions_;
  if (layout.padded_height > limits_.rows) {
    return InvalidArgument("table '", name, "' has ", layout.padded_height,
                           " padded rows, more than the limit of ", limits_.rows);
  }

  std::vector<Stack>& candidates = stacks_[{layout.padded_width, group}];
  Stack* target = nullptr;
  if (stacking_enabled_) {
    for (Stack& stack : candidates) {
      const bool fits =
          static_cast<int64_t>(stack.tables.size()) < limits_.tables &&
          (limits_.activation_mem_bytes == 0 ||
           stack.activation_bytes + activation_bytes < limits_.activation_mem_bytes) &&
          (limits_.variable_shard_bytes == 0 ||
           stack.variable_bytes + variable_bytes < limits_.variable_shard_bytes) &&
          stack.height + layout.padded_height < limits_.rows;
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
  layout.sparse_core_shard_rotation = (position * sparse_cores_per_partition_) % n;
  target->tables.push_back(layout);
  target->height += layout.padded_height;
  target->activation_bytes += activation_bytes;
  target->variable_bytes += variable_bytes;
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
