// Conversion of one feature's ids (dense, SparseTensor indices or RaggedTensor row_splits) into
// COO entries (sample row, id, gain), with combiner normalisation and adjacent duplicate merging
// (docs/preprocessing.md#from-ids-to-coo-entries, docs/preprocessing.md#coo-conversion), and the per-SparseCore split with the table-stacking transform (docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform).
#ifndef SCE_CORE_COO_H_
#define SCE_CORE_COO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/coo_entries.h"
#include "cc/core/status.h"

namespace sce {

enum class Combiner { kSum, kMean, kSqrtn };

Status ParseCombiner(const std::string& name, Combiner* combiner);

// Names used in error messages: which table and feature the input belongs to.
struct Context {
  std::string table;
  std::string feature;
  std::string Describe() const;  // e.g. "table 'video', feature 'f_video'"
};

// A view of the three input tensors of ConvertToCooTensor. `index_rank` / `index_shape` describe
// `indices_or_row_splits`: rank 1 with 0 elements is dense, rank 1 otherwise is row_splits, rank 2
// is SparseTensor indices.
struct IdInput {
  const int32_t* index_data = nullptr;
  int index_rank = 1;
  int64_t index_dim0 = 0;
  int64_t index_dim1 = 0;
  const int32_t* values = nullptr;
  int values_rank = 1;
  int64_t num_values = 0;
  const float* weights = nullptr;
  int weights_rank = 0;
  int64_t num_weights = 0;
};

// See docs/preprocessing.md#coo-conversion. `vocabulary_size` < 0 disables the id range check (ids must still be >= 0).
Status ConvertToCoo(const IdInput& input, int64_t sample_count, Combiner combiner,
                    int64_t vocabulary_size, const Context& context, CooEntries* out);

// Where a feature sits inside its stacked table (docs/layout.md#feature-stacking-and-activation-rows, docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform).
struct StackingTransform {
  int64_t num_sc_per_chip = kDefaultSparseCoresPerReplica;
  int64_t row_offset = 0;                 // the feature's sample offset in the stacked table
  int64_t col_offset = 0;                 // row offset in shard times num_sc_shards
  int64_t col_shift = 0;                  // shard rotation
  int64_t num_sc_shards = kDefaultSparseCoresPerReplica;  // total SparseCores = table shards; a power of two
  int64_t stacked_table_sample_count = 0; // B_stk
};

// The checks of a feature's stacking transform (and its sample count) that every stacked
// conversion makes before reading ids, with messages naming `context`'s table and feature.
Status ValidateStackingTransform(const StackingTransform& transform, int64_t sample_count,
                                 const Context& context);

// See docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform: one CooEntries per SparseCore, rows relative to the SC's block of the stacked batch and
// cols mapped to stacked-table col ids.
Status ConvertToListOfCoo(const IdInput& input, int64_t sample_count, Combiner combiner,
                          const StackingTransform& transform, int64_t vocabulary_size,
                          const Context& context, std::vector<CooEntries>* per_sc);

}  // namespace sce

#endif  // SCE_CORE_COO_H_
