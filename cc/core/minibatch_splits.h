// GetMinibatchSplitsWithPhysicalReplica (docs/preprocessing.md#minibatching): per source SparseCore sort and dedup, bucketing
// of ids by target shard and vocabulary division, and the split bitmask that cuts the vocabulary
// into minibatches small enough for the per-partition limits.
#ifndef SCE_CORE_MINIBATCH_SPLITS_H_
#define SCE_CORE_MINIBATCH_SPLITS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

struct MinibatchSplitsParams {
  int64_t sample_count = 0;  // per-chip batch B
  int64_t num_replica = 1;
  int64_t num_sc_per_chip = 4;
  int64_t table_vocab_size = 0;
  int64_t max_ids_per_partition = 0;
  int64_t max_unique_ids_per_partition = 0;
  int max_division_level = 6;
  std::string table_name;
};

struct MinibatchSplits {
  std::vector<int32_t> rows;       // local sample id in the source SparseCore
  std::vector<int32_t> cols;       // row inside the target shard
  std::vector<float> gains;
  int64_t splits = 0;              // split bitmask (docs/preprocessing.md#split-encoding)
  std::vector<int32_t> id_counts;  // S * P * 2^L + 1 exclusive prefix sums
  int64_t max_ids = 0;
  int64_t max_uniques = 0;
};

Status GetMinibatchSplits(const int32_t* rows, const int32_t* cols, const float* gains,
                          int64_t num_rows, int64_t num_cols, int64_t num_gains,
                          const MinibatchSplitsParams& params, MinibatchSplits* out);

}  // namespace sce

#endif  // SCE_CORE_MINIBATCH_SPLITS_H_
