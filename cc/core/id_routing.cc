#include "cc/core/id_routing.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/radix_sort.h"
#include "cc/core/range_scan.h"

namespace sce {

Status ValidateIdRouting(const IdRoutingParams& p, const int32_t* ids, int64_t n,
                         const std::string& where) {
  SCE_RETURN_IF_ERROR(
      CheckShardGrid(where, p));
  int64_t rows;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the table's rows (replicas * sparse cores * rows per shard)",
                                  {p.num_replicas, p.sparse_cores_per_replica, p.rows_per_shard},
                                  kMaxInt32, &rows));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of ids", n, 0, kMaxInt32));
  if (n > 0 && ids == nullptr) return InvalidArgument(where, ": ids missing");
  const int64_t i = FirstOutOfRange(ids, n, rows);
  if (i >= 0) {
    return InvalidArgument(where, ": ids[", i, "] = ", ids[i], " is not a row of the table (",
                           rows, " rows)");
  }
  return Status::Ok();
}

Status ValidateIdSampleRows(const IdRoutingParams& p, const IdSampleRows& r, int64_t n,
                            const std::string& where) {
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "rows_per_sparse_core", r.rows_per_sparse_core, 0, kMaxInt32));
  int64_t samples;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the samples (sparse cores * rows_per_sparse_core)",
                                  {p.sparse_cores_per_replica, r.rows_per_sparse_core}, kMaxInt32,
                                  &samples));
  if (r.rows_per_sparse_core == 0) return Status::Ok();  // no statistics: row_ids unused
  if (r.num_row_ids != n) {
    return InvalidArgument(where, ": row_ids has ", r.num_row_ids, " entries but ids has ", n,
                           " (one sample row per id)");
  }
  if (n > 0 && r.row_ids == nullptr) return InvalidArgument(where, ": row_ids missing");
  const int64_t bad = FirstUnsortedOrOutOfRange(r.row_ids, n, samples);
  if (bad < 0) return Status::Ok();
  const int32_t row = r.row_ids[bad];
  if (row < 0 || row >= samples) {   // the range is tested first, then the order
    return InvalidArgument(where, ": row_ids[", bad, "] = ", row, " is not a sample row in [0, ",
                           samples, ") (sparse cores * rows_per_sparse_core)");
  }
  return InvalidArgument(where, ": row_ids[", bad, "] = ", row, " is smaller than row_ids[",
                         bad - 1, "] = ", r.row_ids[bad - 1], " (row_ids must be nondecreasing)");
}

namespace {

// The partition statistics from the sorted (key << 32 | entry) words, key = shard * R + c div N:
// shards in order, each col's entries side by side in entry order, hence in row order (rows are
// validated nondecreasing). Within one col, an entry is a new id of its partition when its row
// differs from the previous entry's, and a new unique id when its SparseCore does; a new col is
// both. One counter pair per source SparseCore holds the partition (that SparseCore, the current
// shard): tagged with its shard, it is folded into the maxima and restarted when a later shard
// first reaches it. The only branches are these rare ones: the order of new cols, rows and
// SparseCores is random, a branch on it would often be mispredicted.
void CountPartitions(const uint64_t* sorted, int64_t n, int64_t S, int64_t R,
                     const IdSampleRows& sample_rows, IdRoute* route) {
  struct Partition {
    int64_t shard = -1;
    int32_t ids = 0, uniques = 0;  // each at most n <= 2^31 - 1
  };
  const int32_t* row_ids = sample_rows.row_ids;
  const uint64_t per_sc = static_cast<uint64_t>(sample_rows.rows_per_sparse_core);
  // row div per_sc as the high half of row * ceil(2^64 / per_sc) (per_sc >= 2): exact for
  // row, per_sc < 2^31 (the product exceeds row / per_sc by less than row / 2^64 < 1 / per_sc),
  // and a fraction of the cost of a division per entry.
  const uint64_t reciprocal =
      per_sc == 1 ? 0
                  : static_cast<uint64_t>(((static_cast<unsigned __int128>(1) << 64) - 1) /
                                          per_sc) + 1;
  std::vector<Partition> partitions(S);
  int32_t max_ids = 0, max_uniques = 0;
  auto fold = [&](const Partition& p) {
    max_ids = std::max(max_ids, p.ids);
    max_uniques = std::max(max_uniques, p.uniques);
  };
  int64_t shard = -1, shard_end = 0;  // the current shard; its keys end at shard_end
  uint64_t prev_key = ~uint64_t{0}, prev_row = ~uint64_t{0}, prev_sc = ~uint64_t{0};
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t word = sorted[j];
    const uint64_t key = word >> 32;
    const uint64_t row = static_cast<uint32_t>(row_ids[static_cast<uint32_t>(word)]);
    if (static_cast<int64_t>(key) >= shard_end) {
      shard = static_cast<int64_t>(key) / R;
      shard_end = (shard + 1) * R;
    }
    const uint64_t sc = per_sc == 1 ? row
                                    : static_cast<uint64_t>(
                                          (static_cast<unsigned __int128>(row) * reciprocal) >> 64);
    Partition& p = partitions[sc];
    if (p.shard != shard) {
      fold(p);
      p = Partition{shard, 0, 0};
    }
    const bool new_col = key != prev_key;
    p.ids += static_cast<int32_t>(new_col | (row != prev_row));
    p.uniques += static_cast<int32_t>(new_col | (sc != prev_sc));
    prev_key = key;
    prev_row = row;
    prev_sc = sc;
  }
  for (const Partition& p : partitions) fold(p);
  route->max_ids = max_ids;
  route->max_unique_ids = max_uniques;
}

}  // namespace

void RouteIds(const IdRoutingParams& p, const int32_t* ids, int64_t n, IdRoute* route) {
  RouteIds(p, ids, n, IdSampleRows(), route);
}

void RouteIds(const IdRoutingParams& p, const int32_t* ids, int64_t n,
              const IdSampleRows& sample_rows, IdRoute* route) {
  const int64_t S = p.sparse_cores_per_replica;
  const int64_t R = p.rows_per_shard;
  const int64_t N = p.num_replicas * S;
  const int64_t rows_per_owner = S * R;
  route->counts.assign(p.num_replicas, 0);
  route->rows.clear();
  route->positions.assign(n, 0);
  route->max_ids = 0;
  route->max_unique_ids = 0;
  if (n == 0) return;
  // (key << 32 | entry) words; key = owner * S * R + row = shard * R + c div N < W * S * R
  // <= 2^31 - 1. N is a power of two for every sharded layout (docs/layout.md): then the shard
  // and the row inside it are a mask and a shift, not two divisions per id. The buffer is not
  // zero-filled: every word the sort reads is written here or by the sort.
  std::unique_ptr<uint64_t[]> words(new uint64_t[2 * n]);
  if ((N & (N - 1)) == 0) {
    int log2_n = 0;
    while ((int64_t{1} << log2_n) < N) ++log2_n;
    const uint32_t mask = static_cast<uint32_t>(N - 1);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t c = static_cast<uint32_t>(ids[i]);   // validated: 0 <= ids[i] < 2^31
      const uint64_t key = static_cast<uint64_t>(c & mask) * static_cast<uint64_t>(R) +
                           (c >> log2_n);
      words[i] = (key << 32) | static_cast<uint64_t>(i);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = (ids[i] % N) * R + ids[i] / N;
      words[i] = (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(i);
    }
  }
  int bits = 0;
  while (bits < 31 && (int64_t{1} << bits) < N * R) ++bits;
  const uint64_t* sorted = StableSortWords(words.get(), words.get() + n, n, 32, bits);
  uint64_t previous = ~uint64_t{0};
  int32_t unique = -1;
  // Keys ascend, so the owner only moves forward: its range [begin, end) replaces a division
  // and a remainder per unique id.
  int64_t owner = 0;
  uint64_t owner_begin = 0, owner_end = static_cast<uint64_t>(rows_per_owner);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t key = sorted[j] >> 32;
    if (key != previous) {
      previous = key;
      ++unique;
      while (key >= owner_end) {
        ++owner;
        owner_begin = owner_end;
        owner_end += static_cast<uint64_t>(rows_per_owner);
      }
      route->rows.push_back(static_cast<int32_t>(key - owner_begin));
      ++route->counts[owner];
    }
    route->positions[static_cast<uint32_t>(sorted[j])] = unique;
  }
  if (sample_rows.rows_per_sparse_core > 0) CountPartitions(sorted, n, S, R, sample_rows, route);
}

}  // namespace sce
