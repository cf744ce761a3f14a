// Step 1 of the all-to-all exchange (docs/multi_worker.md#exchange): a replica's ids of one
// stacked table -> the unique ids it must ask for, grouped by the replica that owns them.
//
// Stacked id c lives in shard c mod N (N = W * S SparseCore shards), which replica
// (c mod N) div S owns, at row ((c mod N) mod S) * R + c div N of that replica's variable
// (docs/layout.md#table-layout). The mapping c -> (owner, row) is one to one, so sorting the ids
// by the key owner * S * R + row groups them by owner and puts duplicates side by side.
//
// TensorFlow spells this unique, two divisions and two remainders, a stable argsort (a top-k),
// a bincount, an inverse permutation and two gathers; here it is one radix sort and one scan.
// The order inside an owner's group is by row, not by first occurrence; the exchange's results
// do not depend on it (each replica sends a row at most once, and every sum over a row's
// contributions runs in entry or replica order).
#ifndef SCE_CORE_ID_ROUTING_H_
#define SCE_CORE_ID_ROUTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/status.h"

namespace sce {

using IdRoutingParams = ShardGrid;

struct IdRoute {
  std::vector<int32_t> rows;       // [unique ids]: row in the owner's variable, grouped by owner
  std::vector<int32_t> counts;     // [W]: unique ids per owner
  std::vector<int32_t> positions;  // [ids]: index of each id's unique id in `rows`
};

// Checks W, S, R >= 1, W * S * R within int32 (the table's rows), and every id in [0, W*S*R).
// `where` prefixes messages (e.g. "table 'video'"). Call before RouteIds.
Status ValidateIdRouting(const IdRoutingParams& params, const int32_t* ids, int64_t n,
                         const std::string& where);

// Requires validated arguments.
void RouteIds(const IdRoutingParams& params, const int32_t* ids, int64_t n, IdRoute* route);

}  // namespace sce

#endif  // SCE_CORE_ID_ROUTING_H_
