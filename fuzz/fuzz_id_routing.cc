// libFuzzer target: sce::ValidateIdRouting + sce::RouteIds (cc/core/id_routing.h) with arbitrary
// shard arguments and ids. Whatever is accepted must route every id to the owner and row of the
// table layout rule, with each unique id once.
#include <cstdint>
#include <vector>

#include "cc/core/id_routing.h"
#include "fuzz/fuzz_common.h"

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
  if (!sce::ValidateIdRouting(p, ids.data(), n, "fuzz").ok()) return 0;
  sce::IdRoute route;
  sce::RouteIds(p, ids.data(), n, &route);
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
  return 0;
}
