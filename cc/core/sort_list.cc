#include "cc/core/sort_list.h"

#include <algorithm>
#include <numeric>

#include "cc/core/constants.h"

namespace sce {
namespace {

// An entry that survives dedup, in the order the scatter step visits it.
struct Kept {
  int32_t row;
  int32_t col;
  float gain;
};

// Shared by §6 and §7: groups features by member table, sorts each group by (col, row, position),
// merges duplicate (row, col) pairs into their first occurrence, and counts per target shard.
Status SortDedupAndCount(const std::vector<FeatureCooView>& features, int64_t num_replica,
                         int64_t num_sc_per_chip, const std::string& table_name,
                         std::vector<Kept>* kept, ShardCounts* counts) {
  const int64_t num_shards = num_replica * num_sc_per_chip;
  if (!IsPowerOfTwo(num_shards)) {
    return FailedPrecondition("table '", table_name, "': num_replica * num_sc_per_chip (",
                              num_shards, ") must be a power of two");
  }
  const int32_t mask = static_cast<int32_t>(num_shards - 1);
  counts->ids.assign(num_shards, 0);
  counts->uniques.assign(num_shards, 0);

  int64_t batch = 0;
  for (size_t f = 0; f < features.size(); ++f) {
    const FeatureCooView& v = features[f];
    if (v.num_rows != v.num_cols || v.num_rows != v.num_gains) {
      return InvalidArgument("table '", table_name, "': feature ", f, " has ", v.num_rows,
                             " row ids, ", v.num_cols, " col ids and ", v.num_gains,
                             " gains; they must match");
    }
    batch += v.sample_count;
  }
  if (batch <= 0) {
    return InvalidArgument("table '", table_name, "': the sum of sample_count_list must be > 0");
  }

  // Member tables in ascending col_offset; features of one table stay in input order.
  std::vector<size_t> order(features.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return features[a].col_offset < features[b].col_offset;
  });

  struct Token {
    int32_t col;
    int32_t row;
    float gain;
  };
  std::vector<Token> group;
  for (size_t g = 0; g < order.size();) {
    size_t end = g;
    group.clear();
    while (end < order.size() && features[order[end]].col_offset == features[order[g]].col_offset) {
      const FeatureCooView& v = features[order[end]];
      for (int64_t i = 0; i < v.num_rows; ++i) {
        if (v.cols[i] < 0 || v.rows[i] < 0) {
          return InvalidArgument("table '", table_name, "': negative id or row (row ", v.rows[i],
                                 ", col ", v.cols[i], ") in feature ", order[end]);
        }
        group.push_back({v.cols[i], v.rows[i], v.gains[i]});
      }
      ++end;
    }
    // Stable sort by (col, row): equal pairs keep input order, so gains merge into the first one.
    std::stable_sort(group.begin(), group.end(), [](const Token& a, const Token& b) {
      return a.col != b.col ? a.col < b.col : a.row < b.row;
    });
    int32_t prev_row = -1, prev_col = -1;
    for (const Token& t : group) {
      if (t.row == prev_row && t.col == prev_col) {
        if (kept) kept->back().gain += t.gain;
        continue;
      }
      const int32_t shard = t.col & mask;
      ++counts->ids[shard];
      if (t.col != prev_col) ++counts->uniques[shard];
      if (kept) kept->push_back({t.row, t.col, t.gain});
      prev_row = t.row;
      prev_col = t.col;
    }
    g = end;
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
  const int64_t num_shards = num_replica * num_sc_per_chip;
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
  for (const FeatureCooView& v : features) batch += v.sample_count;
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
