// GetMinibatchSplitsWithPhysicalReplica (docs/preprocessing.md#minibatching): per source SparseCore sort and dedup, bucketing
// of ids by target shard and vocabulary division, and the split bitmask that cuts the vocabulary
// into minibatches small enough for the per-partition limits.
#ifndef SCE_CORE_MINIBATCH_SPLITS_H_
#define SCE_CORE_MINIBATCH_SPLITS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/coo_entries.h"
#include "cc/core/parallel.h"
#include "cc/core/status.h"

namespace sce {

struct MinibatchSplitsParams {
  int64_t sample_count = 0;  // per-chip batch B
  int64_t num_replica = 1;
  int64_t num_sc_per_chip = kDefaultSparseCoresPerReplica;
  int64_t table_vocab_size = 0;
  int64_t max_ids_per_partition = 0;
  int64_t max_unique_ids_per_partition = 0;
  int max_division_level = kDefaultMaxDivisionLevel;
  std::string table_name;
};

// rows: local sample id in the source SparseCore; cols: row inside the target shard.
struct MinibatchSplits : CooEntries {
  int64_t splits = 0;              // split bitmask (docs/preprocessing.md#split-encoding)
  std::vector<int32_t> id_counts;  // S * P * 2^L + 1 exclusive prefix sums
  int64_t max_ids = 0;
  int64_t max_uniques = 0;
};

// Entries of the id_counts output: S * P * 2^L + 1 exclusive prefix sums (P = num_replica * S),
// checked against kMaxIdCounts + 1. The one home of the formula (the core and the op's shape
// function call it); errors start with `where`.
Status MinibatchIdCountsSize(const std::string& where, int64_t num_replica,
                             int64_t num_sc_per_chip, int64_t max_division_level, int64_t* size);

// Where the deduplicated ids go: asked once, with their number, for three buffers of that size
// (e.g. the op's output tensors, so the ids are written once, in place). A failing status fails
// the call.
struct SplitIdBuffers {
  int32_t* rows = nullptr;
  int32_t* cols = nullptr;
  float* gains = nullptr;
};
using SplitIdAllocator = std::function<Status(int64_t total, SplitIdBuffers* buffers)>;

// Without `allocate` the ids are written to out->rows / cols / gains; with it, to the buffers it
// gives (and out's id vectors stay empty).
Status GetMinibatchSplits(const int32_t* rows, const int32_t* cols, const float* gains,
                          int64_t num_rows, int64_t num_cols, int64_t num_gains,
                          const MinibatchSplitsParams& params, MinibatchSplits* out,
                          const ParallelFor& parallel_for = RunSerially,
                          const SplitIdAllocator& allocate = nullptr);

}  // namespace sce

#endif  // SCE_CORE_MINIBATCH_SPLITS_H_
