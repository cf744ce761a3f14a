// libFuzzer target: sce::ValidateIdRouting + sce::ValidateIdSampleRows + sce::RouteIds
// (cc/core/id_routing.h) with arbitrary shard arguments, ids and sample rows. Whatever is accepted
// must route every id to the owner and row of the table layout rule, with each unique id once,
// the same with and without the partition statistics, and the statistics must be the brute-force
// maxima over (source SparseCore, target shard) partitions.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "cc/core/id_routing.h"
#include "fuzz/fuzz_common.h"

namespace {

// Most entries of one (row div per_sc, col mod N) partition among the distinct (a, col) pairs,
// a = row (ids) or row div per_sc (unique ids).
int32_t MaxPerPartition(const std::vector<int32_t>& rows, const std::vector<int32_t>& cols,
                        int64_t N, int64_t per_sc, bool by_row) {
  std::vector<std::array<int64_t, 2>> pairs;
  for (size_t i = 0; i < rows.size(); ++i) {
    pairs.push_back({by_row ? rows[i] : rows[i] / per_sc, cols[i]});
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  std::vector<std::array<int64_t, 2>> partitions;
  for (const auto& p : pairs) partitions.push_back({by_row ? p[0] / per_sc : p[0], p[1] % N});
  std::sort(partitions.begin(), partitions.end());
  int32_t best = 0;
  for (size_t a = 0, b = 0; a < partitions.size(); a = b) {
    while (b < partitions.size() && partitions[b] == partitions[a]) ++b;
    best = std::max(best, static_cast<int32_t>(b - a));
  }
  return best;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  sce::IdRoutingParams p;
  p.num_replicas = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 5) : sce_fuzz::Attr(in, 5);
  p.sparse_cores_per_replica =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 4) : sce_fuzz::Attr(in, 4);
  p.rows_per_shard = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 50)
                                      : sce_fuzz::Attr(in, 50);
  std::vector<int32_t> ids = sce_fuzz::Ids(in, 300, 400);
  const int64_t n = static_cast<int64_t>(ids.size());
  // The statistics: none (0), an arbitrary attribute, or a few rows per SparseCore; sorted rows,
  // now and then one entry more or fewer than ids or an arbitrary value.
  sce::IdSampleRows sample_rows;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      break;
    case 1:
      sample_rows.rows_per_sparse_core = sce_fuzz::Attr(in, 8);
      break;
    default:
      sample_rows.rows_per_sparse_core = in.ConsumeIntegralInRange<int64_t>(1, 8);
  }
  const int64_t num_rows =
      in.ConsumeIntegralInRange<int>(0, 15) == 0
          ? std::max<int64_t>(0, n + in.ConsumeIntegralInRange<int64_t>(-1, 1))
          : n;
  std::vector<int32_t> row_ids = sce_fuzz::Sorted(in, static_cast<size_t>(num_rows), 0, 2);
  sample_rows.row_ids = row_ids.data();
  sample_rows.num_row_ids = static_cast<int64_t>(row_ids.size());
  if (!sce::ValidateIdRouting(p, ids.data(), n, "fuzz").ok()) return 0;
  const bool rows_ok = sce::ValidateIdSampleRows(p, sample_rows, n, "fuzz").ok();
  sce::IdRoute route;
  sce::RouteIds(p, ids.data(), n, &route);
  SCE_FUZZ_CHECK(route.max_ids == 0 && route.max_unique_ids == 0);
  SCE_FUZZ_CHECK(static_cast<int64_t>(route.counts.size()) == p.num_replicas);
  SCE_FUZZ_CHECK(static_cast<int64_t>(route.positions.size()) == n);
  std::vector<int64_t> owner_of_unique;
  for (int64_t d = 0; d < p.num_replicas; ++d) {
    SCE_FUZZ_CHECK(route.counts[d] >= 0);
    owner_of_unique.insert(owner_of_unique.end(), route.counts[d], d);
  }
  SCE_FUZZ_CHECK(owner_of_unique.size() == route.rows.size());
  const int64_t N = p.num_replicas * p.sparse_cores_per_replica;
  std::vector<bool> used(route.rows.size(), false);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t u = route.positions[i];
    SCE_FUZZ_CHECK(u >= 0 && u < static_cast<int32_t>(route.rows.size()));
    const int64_t shard = ids[i] % N;
    SCE_FUZZ_CHECK(owner_of_unique[u] == shard / p.sparse_cores_per_replica);
    SCE_FUZZ_CHECK(route.rows[u] == (shard % p.sparse_cores_per_replica) * p.rows_per_shard +
                                        ids[i] / N);
    used[u] = true;
  }
  for (bool u : used) SCE_FUZZ_CHECK(u);   // no unique id without an id
  if (!rows_ok) return 0;

  // Accepted rows: sorted, in range, one per id (or not read at all without statistics).
  const int64_t per_sc = sample_rows.rows_per_sparse_core;
  if (per_sc > 0) {
    SCE_FUZZ_CHECK(row_ids.size() == ids.size());
    for (size_t i = 0; i < row_ids.size(); ++i) {
      SCE_FUZZ_CHECK(row_ids[i] >= 0 && row_ids[i] < p.sparse_cores_per_replica * per_sc);
      SCE_FUZZ_CHECK(i == 0 || row_ids[i] >= row_ids[i - 1]);
    }
  }
  sce::IdRoute with_stats;
  sce::RouteIds(p, ids.data(), n, sample_rows, &with_stats);
  SCE_FUZZ_CHECK(with_stats.rows == route.rows && with_stats.counts == route.counts &&
                 with_stats.positions == route.positions);
  if (per_sc == 0) {
    SCE_FUZZ_CHECK(with_stats.max_ids == 0 && with_stats.max_unique_ids == 0);
    return 0;
  }
  SCE_FUZZ_CHECK(with_stats.max_ids == MaxPerPartition(row_ids, ids, N, per_sc, true));
  SCE_FUZZ_CHECK(with_stats.max_unique_ids == MaxPerPartition(row_ids, ids, N, per_sc, false));
  return 0;
}
