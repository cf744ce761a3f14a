// Per-(stacked table, source SparseCore) sort, dedup and bucketing by target shard (docs/preprocessing.md#sort-dedup-and-bucket), and
// the statistics variant that only counts ids and unique ids per shard (docs/preprocessing.md#id-statistics).
#ifndef SCE_CORE_SORT_LIST_H_
#define SCE_CORE_SORT_LIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/coo_entries.h"
#include "cc/core/status.h"

namespace sce {

// One feature's COO entries for one source SparseCore (outputs of ConvertToListOfCoo).
struct FeatureCooView : CooEntriesView {
  int64_t sample_count = 0;  // B_f / S
  int64_t col_offset = 0;    // identifies the member table of the stack
};

// rows: local sample id within the source SparseCore; cols: row inside the target shard.
struct SortedCoo : CooEntries {
  std::vector<int32_t> id_counts;  // P + 1 exclusive prefix sums of ids per target shard
};

struct ShardCounts {
  std::vector<int64_t> ids;      // per target shard, after (row, col) dedup
  std::vector<int64_t> uniques;  // distinct cols per target shard
};

// See docs/preprocessing.md#id-statistics (GetStatsFromListOfSparseCoreCooTensors) for one source SparseCore.
Status CountIdsPerShard(const std::vector<FeatureCooView>& features, int64_t num_replica,
                        int64_t num_sc_per_chip, const std::string& table_name,
                        ShardCounts* counts);

// See docs/preprocessing.md#sort-dedup-and-bucket (SortListOfSparseCoreCooTensors) for one source SparseCore.
Status SortListOfCoo(const std::vector<FeatureCooView>& features, int64_t num_replica,
                     int64_t num_sc_per_chip, int64_t max_ids_per_sparse_core,
                     int64_t max_unique_ids_per_sparse_core, const std::string& table_name,
                     SortedCoo* out);

}  // namespace sce

#endif  // SCE_CORE_SORT_LIST_H_
