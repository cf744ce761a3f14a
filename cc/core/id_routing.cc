#include "cc/core/id_routing.h"

#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/radix_sort.h"

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
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) {
      return InvalidArgument(where, ": ids[", i, "] = ", ids[i], " is not a row of the table (",
                             rows, " rows)");
    }
  }
  return Status::Ok();
}

void RouteIds(const IdRoutingParams& p, const int32_t* ids, int64_t n, IdRoute* route) {
  const int64_t S = p.sparse_cores_per_replica;
  const int64_t R = p.rows_per_shard;
  const int64_t N = p.num_replicas * S;
  const int64_t rows_per_owner = S * R;
  route->counts.assign(p.num_replicas, 0);
  route->rows.clear();
  route->positions.assign(n, 0);
  if (n == 0) return;
  // (key << 32 | entry) words; key = owner * S * R + row < W * S * R <= 2^31 - 1.
  std::vector<uint64_t> words(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t shard = ids[i] % N;
    const int64_t key = (shard / S) * rows_per_owner + (shard % S) * R + ids[i] / N;
    words[i] = (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(i);
  }
  int bits = 0;
  while (bits < 31 && (int64_t{1} << bits) < N * R) ++bits;
  const uint64_t* sorted = StableSortWords(words.data(), words.data() + n, n, 32, bits);
  uint64_t previous = ~uint64_t{0};
  int32_t unique = -1;
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t key = sorted[j] >> 32;
    if (key != previous) {
      previous = key;
      ++unique;
      route->rows.push_back(static_cast<int32_t>(key % rows_per_owner));
      ++route->counts[key / rows_per_owner];
    }
    route->positions[static_cast<uint32_t>(sorted[j])] = unique;
  }
}

}  // namespace sce
