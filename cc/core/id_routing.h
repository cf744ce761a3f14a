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
//
// Partition statistics (optional). The exchange also reports, per stacked table, the largest
// number of ids and of unique ids in one partition, where a partition is a (source SparseCore,
// target shard) pair: the source SparseCore of an id is its sample row div rows_per_sparse_core
// (the stacked COO holds S blocks of rows_per_sparse_core samples), its target shard is
// c mod N. An id counts once per sample (repeats of a col in one row are one id, as the
// minibatch-splits op merges them) and a unique id once per partition. These are exactly the
// max_ids / max_uniques of SceGetMinibatchSplitsWithPhysicalReplica at max_division_level 0
// without limits, whose shard is col & (N - 1) (it requires N to be a power of two; here any N,
// same value where both are defined). Since the key is shard * R + c div N, the sort above has
// already put every col's entries side by side, shards in order, and kept them in entry order,
// i.e. in row order; one more pass over the sorted words, reading each entry's row, counts them
// with S counters (the partitions of the current shard). So the exchange gets the statistics
// without running the splits op, with its own sort and dedup, only for these two numbers.
#ifndef SCE_CORE_ID_ROUTING_H_
#define SCE_CORE_ID_ROUTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/status.h"

namespace sce {

using IdRoutingParams = ShardGrid;

// The sample rows of the ids (the stacked COO's row_ids), read only for the statistics.
struct IdSampleRows {
  int64_t rows_per_sparse_core = 0;  // 0: no statistics (row_ids is not read)
  const int32_t* row_ids = nullptr;  // [num_row_ids]; entry i is the sample row of ids[i]
  int64_t num_row_ids = 0;
};

struct IdRoute {
  std::vector<int32_t> rows;       // [unique ids]: row in the owner's variable, grouped by owner
  std::vector<int32_t> counts;     // [W]: unique ids per owner
  std::vector<int32_t> positions;  // [ids]: index of each id's unique id in `rows`
  // The partition statistics (0 without rows_per_sparse_core or without ids): the most distinct
  // (row, col) pairs and the most distinct cols of one (source SparseCore, target shard) pair.
  int32_t max_ids = 0;
  int32_t max_unique_ids = 0;
};

// Checks W, S, R >= 1, W * S * R within int32 (the table's rows), and every id in [0, W*S*R).
// `where` prefixes messages (e.g. "table 'video'"). Call before RouteIds.
Status ValidateIdRouting(const IdRoutingParams& params, const int32_t* ids, int64_t n,
                         const std::string& where);

// Checks rows_per_sparse_core in [0, 2^31 - 1] and S * rows_per_sparse_core within int32; when it
// is > 0, also that there are n row_ids, each in [0, S * rows_per_sparse_core) and not smaller
// than the one before. Call (after ValidateIdRouting) before the RouteIds that takes `rows`.
Status ValidateIdSampleRows(const IdRoutingParams& params, const IdSampleRows& rows, int64_t n,
                            const std::string& where);

// Requires validated arguments. Without `rows` (or with rows_per_sparse_core 0) the statistics
// are 0; rows, counts and positions do not depend on them.
void RouteIds(const IdRoutingParams& params, const int32_t* ids, int64_t n, IdRoute* route);
void RouteIds(const IdRoutingParams& params, const int32_t* ids, int64_t n,
              const IdSampleRows& rows, IdRoute* route);

}  // namespace sce

#endif  // SCE_CORE_ID_ROUTING_H_
