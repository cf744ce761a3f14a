#include "cc/core/sort_list.h"

#include <algorithm>
#include <numeric>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/radix_sort.h"

namespace sce {
namespace {

// An entry that survives dedup, in the order the scatter step visits it.
struct Kept {
  int32_t row;
  int32_t col;
  float gain;
};

// The shard count (a power of two), equal lengths per feature, and a batch and id total that fit
// the int32 buffer formats. Sets *num_shards.
Status ValidateFeatures(const std::vector<FeatureCooView>& features, int64_t num_replica,
                        int64_t num_sc_per_chip, const std::string& table_name,
                        int64_t* num_shards) {
  const std::string where = "table '" + table_name + "'";
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_replica", num_replica, 1, kMaxReplicas));
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "num_sc_per_chip", num_sc_per_chip, 1, kMaxSparseCoresPerChip));
  SCE_RETURN_IF_ERROR(CheckedSize(where, "num_replica * num_sc_per_chip",
                                  {num_replica, num_sc_per_chip}, kMaxShards, num_shards));
  if (!IsPowerOfTwo(*num_shards)) {
    return FailedPrecondition("table '", table_name, "': num_replica * num_sc_per_chip (",
                              *num_shards, ") must be a power of two");
  }
  int64_t batch = 0, total_ids = 0;
  for (size_t f = 0; f < features.size(); ++f) {
    const FeatureCooView& v = features[f];
    if (v.num_rows != v.num_cols || v.num_rows != v.num_gains) {
      return InvalidArgument("table '", table_name, "': feature ", f, " has ", v.num_rows,
                             " row ids, ", v.num_cols, " col ids and ", v.num_gains,
                             " gains; they must match");
    }
    if (!CheckedAdd(batch, v.sample_count, &batch) || !CheckedAdd(total_ids, v.num_rows, &total_ids) ||
        total_ids > kMaxInt32) {
      return InvalidArgument(where, ": the sum of sample_count_list or the number of ids (",
                             "feature ", f, ") does not fit the int32 buffer formats");
    }
  }
  if (batch <= 0) {
    return InvalidArgument("table '", table_name, "': the sum of sample_count_list must be > 0");
  }
  return Status::Ok();
}

// Collects the entries of the features order_of_features[g, *end) that share one member table
// (one col_offset) into `group`; *rows_sorted tells whether their rows are already ascending.
Status GatherGroup(const std::vector<FeatureCooView>& features,
                   const std::vector<size_t>& order_of_features, size_t g,
                   const std::string& table_name, CooEntries* group, bool* rows_sorted,
                   size_t* end) {
  group->rows.clear();
  group->cols.clear();
  group->gains.clear();
  *rows_sorted = true;
  const int64_t group_offset = features[order_of_features[g]].col_offset;
  for (*end = g; *end < order_of_features.size() &&
                 features[order_of_features[*end]].col_offset == group_offset;
       ++*end) {
    const FeatureCooView& v = features[order_of_features[*end]];
    for (int64_t i = 0; i < v.num_rows; ++i) {
      if (v.cols[i] < 0 || v.rows[i] < 0) {
        return InvalidArgument("table '", table_name, "': negative id or row (row ", v.rows[i],
                               ", col ", v.cols[i], ") in feature ", order_of_features[*end]);
      }
      if (!group->rows.empty() && v.rows[i] < group->rows.back()) *rows_sorted = false;
      group->Push(v.rows[i], v.cols[i], v.gains[i]);
    }
  }
  return Status::Ok();
}

// Orders the group by (col, row, position): equal (row, col) pairs become adjacent in input
// order, so gains merge into the first occurrence. With rows already sorted a stable sort by col
// does it.
void SortGroup(const CooEntries& group, bool rows_sorted, std::vector<uint32_t>* order,
               std::vector<uint64_t>* scratch) {
  const std::vector<int32_t>& cols = group.cols;
  const std::vector<int32_t>& rows = group.rows;
  if (rows_sorted) {
    StableSortByKey(cols.data(), static_cast<int64_t>(cols.size()), order, scratch);
    return;
  }
  order->resize(cols.size());
  std::iota(order->begin(), order->end(), 0u);
  std::stable_sort(order->begin(), order->end(), [&](uint32_t a, uint32_t b) {
    return cols[a] != cols[b] ? cols[a] < cols[b] : rows[a] < rows[b];
  });
}

// Merges duplicate (row, col) pairs of the sorted group (into `kept`, if given) and counts ids
// and unique ids per target shard.
void DedupAndCountGroup(const CooEntries& group, const std::vector<uint32_t>& order,
                        int32_t mask, std::vector<Kept>* kept, ShardCounts* counts) {
  int32_t prev_row = -1, prev_col = -1;
  for (uint32_t i : order) {
    const int32_t row = group.rows[i], col = group.cols[i];
    if (row == prev_row && col == prev_col) {
      if (kept) kept->back().gain += group.gains[i];
      continue;
    }
    const int32_t shard = col & mask;
    ++counts->ids[shard];
    if (col != prev_col) ++counts->uniques[shard];
    if (kept) kept->push_back({row, col, group.gains[i]});
    prev_row = row;
    prev_col = col;
  }
}

// Shared by docs/preprocessing.md#sort-dedup-and-bucket and docs/preprocessing.md#id-statistics:
// groups features by member table, sorts each group by (col, row, position), merges duplicate
// (row, col) pairs into their first occurrence, and counts per target shard.
Status SortDedupAndCount(const std::vector<FeatureCooView>& features, int64_t num_replica,
                         int64_t num_sc_per_chip, const std::string& table_name,
                         std::vector<Kept>* kept, ShardCounts* counts) {
  int64_t num_shards;
  SCE_RETURN_IF_ERROR(
      ValidateFeatures(features, num_replica, num_sc_per_chip, table_name, &num_shards));
  const int32_t mask = static_cast<int32_t>(num_shards - 1);
  counts->ids.assign(num_shards, 0);
  counts->uniques.assign(num_shards, 0);
  // Member tables in ascending col_offset; features of one table stay in input order.
  std::vector<size_t> order_of_features(features.size());
  std::iota(order_of_features.begin(), order_of_features.end(), 0);
  std::stable_sort(order_of_features.begin(), order_of_features.end(), [&](size_t a, size_t b) {
    return features[a].col_offset < features[b].col_offset;
  });
  CooEntries group;
  std::vector<uint32_t> order;
  std::vector<uint64_t> scratch;
  for (size_t g = 0, end = 0; g < order_of_features.size(); g = end) {
    bool rows_sorted;
    SCE_RETURN_IF_ERROR(
        GatherGroup(features, order_of_features, g, table_name, &group, &rows_sorted, &end));
    SortGroup(group, rows_sorted, &order, &scratch);
    DedupAndCountGroup(group, order, mask, kept, counts);
  }
  return Status::Ok();
}

}  // namespace

Status CountIdsPerShard(const std::vector<FeatureCooView>& features, int64_t num_replica,
                        int64_t num_sc_per_chip, const std::string& table_name,
                        ShardCounts* counts) {
  return SortDedupAndCount(features, num_replica, num_sc_per_chip, table_name, nullptr, counts);
}

Status SortListOfCoo(const std::vector<FeatureCooView>& features, int64_t num_replica,
                     int64_t num_sc_per_chip, int64_t max_ids_per_sparse_core,
                     int64_t max_unique_ids_per_sparse_core, const std::string& table_name,
                     SortedCoo* out) {
  if (max_ids_per_sparse_core <= 0 || max_unique_ids_per_sparse_core <= 0) {
    return InvalidArgument("table '", table_name,
                           "': max_ids_per_sparse_core and max_unique_ids_per_sparse_core must be "
                           "> 0, got ",
                           max_ids_per_sparse_core, " and ", max_unique_ids_per_sparse_core);
  }
  std::vector<Kept> kept;
  ShardCounts counts;
  SCE_RETURN_IF_ERROR(
      SortDedupAndCount(features, num_replica, num_sc_per_chip, table_name, &kept, &counts));
  const int64_t num_shards = static_cast<int64_t>(counts.ids.size());  // validated above
  for (int64_t p = 0; p < num_shards; ++p) {
    if (counts.ids[p] > max_ids_per_sparse_core) {
      return InvalidArgument("table '", table_name, "': sparse core ", p, " gets ", counts.ids[p],
                             " ids while the max ids per sparse core is set to be ",
                             max_ids_per_sparse_core);
    }
    if (counts.uniques[p] > max_unique_ids_per_sparse_core) {
      return InvalidArgument("table '", table_name, "': sparse core ", p, " gets ",
                             counts.uniques[p],
                             " unique ids while the max unique ids per sparse core is set to be ",
                             max_unique_ids_per_sparse_core);
    }
  }
  int64_t batch = 0;
  for (const FeatureCooView& v : features) batch += v.sample_count;  // checked above
  const int pbits = Log2(num_shards);
  const int32_t mask = static_cast<int32_t>(num_shards - 1);

  out->id_counts.assign(num_shards + 1, 0);
  for (int64_t p = 0; p < num_shards; ++p) {
    out->id_counts[p + 1] = out->id_counts[p] + static_cast<int32_t>(counts.ids[p]);
  }
  out->rows.resize(kept.size());
  out->cols.resize(kept.size());
  out->gains.resize(kept.size());
  std::vector<int64_t> next(out->id_counts.begin(), out->id_counts.end() - 1);
  for (const Kept& k : kept) {
    const int64_t slot = next[k.col & mask]++;
    out->rows[slot] = static_cast<int32_t>(k.row % batch);
    out->cols[slot] = k.col >> pbits;
    out->gains[slot] = k.gain;
  }
  return Status::Ok();
}

}  // namespace sce
