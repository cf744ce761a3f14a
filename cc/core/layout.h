// Table layout (docs/layout.md#table-layout): padding of rows to a multiple of 8 x SparseCores and columns to a
// multiple of 8, first-fit stacking of tables with the same padded width and group, row offsets
// inside each shard, and shard rotation.
#ifndef SCE_CORE_LAYOUT_H_
#define SCE_CORE_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/status.h"

namespace sce {

struct TableLayout {
  std::string table_name;
  std::string stacked_table_name;
  int64_t num_sparse_cores = 0;  // N = partitions * SparseCores per partition
  int64_t num_partitions = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t padded_height = 0;
  int64_t padded_width = 0;
  int64_t sparse_core_shard_row_offset = 0;  // rows before this table inside each shard
  int64_t sparse_core_shard_rotation = 0;    // shard of logical row 0
  int64_t total_rows_per_sparse_core_shard = 0;
  int64_t per_sparse_core_batch_size = 0;
  int64_t num_features = 0;
};

struct StackerLimits {
  int64_t activation_mem_bytes = 2 * 1024 * 1024;            // 0 disables the limit
  int64_t variable_shard_bytes = int64_t{2} * 1024 * 1024 * 1024;  // 0 disables the limit
  int64_t rows = (int64_t{1} << 31) - 1;
  int64_t tables = (int64_t{1} << 31) - 1;
};

class LayoutStacker {
 public:
  LayoutStacker(int64_t num_partitions, int64_t sparse_cores_per_partition,
                bool disable_table_stacking, StackerLimits limits = StackerLimits());

  Status AddTable(const std::string& name, int64_t height, int64_t width, const std::string& group,
                  int64_t output_samples, int64_t num_features);

  // Layouts ordered by (padded width, group), then stack creation order, then insertion order.
  std::vector<TableLayout> GetLayouts() const;

 private:
  struct Stack {
    std::vector<TableLayout> tables;
    int64_t height = 0;
    int64_t activation_bytes = 0;
    int64_t variable_bytes = 0;
  };
  int64_t num_partitions_;
  int64_t sparse_cores_per_partition_;
  int64_t num_sparse_cores_;
  bool stacking_enabled_;
  StackerLimits limits_;
  Status config_error_;  // set by the constructor for impossible partition / SparseCore counts
  std::map<std::pair<int64_t, std::string>, std::vector<Stack>> stacks_;
  std::vector<std::string> names_;
};

}  // namespace sce

#endif  // SCE_CORE_LAYOUT_H_
