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

// How one source SparseCore's ids are packed into the 64-bit words the splits sort
// (docs/preprocessing.md#sort-dedup-and-bucket): the sort key (target shard above the row inside
// the shard), then, when everything fits in 64 bits, the id's row inside the SparseCore, then its
// position in the SparseCore's input order. The engine sets it per SparseCore from the id count
// and the largest col.
struct SortWordFormat {
  int pbits = 0;              // log2 of the number of shards
  int32_t shard_mask = 0;     // shards - 1
  int shard_row_bits = 0;     // bits of the largest row inside a shard
  int key_bits = 0;
  int key_shift = 0;          // the key's lowest bit in the word
  int row_bits = 0;
  int position_bits = 0;
  bool rows_in_words = false;
  uint64_t row_mask = 0;      // all ones with rows_in_words, else 0: the word holds no row

  // col in [0, 2^31), local_row in [0, 2^31). Unsigned 64-bit arithmetic without branches, so
  // that loops of Pack vectorize.
  uint64_t Pack(uint64_t col, uint64_t local_row, uint64_t position) const {
    const uint64_t key = ((col & static_cast<uint64_t>(shard_mask)) << shard_row_bits) |
                         (col >> pbits);
    return (key << key_shift) | ((local_row & row_mask) << position_bits) | position;
  }
};

// Where GetMinibatchSplitsFrom reads one stacked table's ids, SparseCore by SparseCore, in the
// order of the concatenated COO the op takes: rows sorted, SparseCore s holding the rows
// [s * B / S, (s + 1) * B / S). Calls for different SparseCores run in parallel.
class SplitsIdSource {
 public:
  virtual ~SplitsIdSource() = default;
  // The number of ids of SparseCore s.
  virtual int64_t Count(int64_t s) const = 0;
  // An upper bound of SparseCore s's cols (>= 0): the sort key needs its bits.
  virtual int32_t MaxCol(int64_t s) const = 0;
  // Writes SparseCore s's Count(s) ids as sort words (format.Pack, position k for its k-th id),
  // and points *gains at their gains in the same order: the source's own array or `gain_scratch`
  // (Count(s) floats) filled here. Without format.rows_in_words, also the rows inside the
  // SparseCore into `row_scratch` (Count(s) entries). A failing status (a bad id) fails the call
  // before anything is written to the outputs.
  virtual Status Fill(int64_t s, const SortWordFormat& format, uint64_t* words,
                      float* gain_scratch, int32_t* row_scratch, const float** gains) const = 0;
};

// Checks the attributes of a minibatch-splits call (everything but the ids).
Status ValidateMinibatchSplitsParams(const MinibatchSplitsParams& params);

// The engine of GetMinibatchSplits for any id source; `params` must have passed
// ValidateMinibatchSplitsParams.
Status GetMinibatchSplitsFrom(const SplitsIdSource& source, const MinibatchSplitsParams& params,
                              MinibatchSplits* out, const ParallelFor& parallel_for = RunSerially,
                              const SplitIdAllocator& allocate = nullptr);

// Without `allocate` the ids are written to out->rows / cols / gains; with it, to the buffers it
// gives (and out's id vectors stay empty).
Status GetMinibatchSplits(const int32_t* rows, const int32_t* cols, const float* gains,
                          int64_t num_rows, int64_t num_cols, int64_t num_gains,
                          const MinibatchSplitsParams& params, MinibatchSplits* out,
                          const ParallelFor& parallel_for = RunSerially,
                          const SplitIdAllocator& allocate = nullptr);

}  // namespace sce

#endif  // SCE_CORE_MINIBATCH_SPLITS_H_
