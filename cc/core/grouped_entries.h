// A lookup's entries grouped by activation row, once per batch, before the lookup
// (docs/lookup.md#grouping-at-enqueue). SparseDenseMatmul groups each block's entries by sample
// itself (sample_major_order.h) on every call; with one replica the grouping depends on the batch
// alone, so the embedding's `enqueue` builds it next to the CSR buffers, in the input pipeline,
// and the lookup of `dequeue` only sums rows. The grouping is a CSR of the activations: activation
// row a (in the lookup's output order, feature-major or the CSR's) is the gain-weighted sum of
// table rows rows[row_begin[a] .. row_begin[a + 1]), added in the order SparseDenseMatmul adds them,
// so both lookups give the same bits.
#ifndef SCE_CORE_GROUPED_ENTRIES_H_
#define SCE_CORE_GROUPED_ENTRIES_H_

#include <cstdint>
#include <string>

#include "cc/core/activation_rows.h"
#include "cc/core/csr_view.h"
#include "cc/core/parallel.h"
#include "cc/core/status.h"
#include "cc/core/vector_isa.h"

namespace sce {

// Ok when `view` (which must have passed ValidateCsrView) can be grouped: its table rows fit the
// int32 row index of the grouping; otherwise InvalidArgument naming the table.
Status CheckGroupable(const CsrView& view);

// First pass: row_begin[a + 1] = the number of valid entries of activation row a (rows in the
// order `feature_rows_per_sc` gives, ValidateFeatureRows passed), then prefix sums, so that
// row_begin[0] = 0 and row_begin[input_size] = *num_entries. `row_begin` has view.input_size + 1
// slots. InvalidArgument naming the table when the total exceeds int32 (nothing else fails).
Status CountEntriesPerActivationRow(const CsrView& view,
                                    const FeatureRowsPerSc& feature_rows_per_sc,
                                    int32_t* row_begin, int64_t* num_entries,
                                    const ParallelFor& parallel_for);

// Second pass: writes each valid entry's table row (shard offset included) and gain at its
// activation row's next slot. `cursor` holds row_begin[0 .. input_size) on entry (a scratch copy;
// it is advanced); `rows` and `gains` have the count's *num_entries slots.
void PlaceEntriesByActivationRow(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
                                 int32_t* cursor, int32_t* rows, float* gains,
                                 const ParallelFor& parallel_for);

// What the grouped lookup reads, as given to its op: row_begin has num_activation_rows + 1
// entries, rows and gains num_entries each.
struct GroupedEntries {
  const int32_t* row_begin = nullptr;
  int64_t num_row_begin = 0;
  const int32_t* rows = nullptr;
  int64_t num_rows = 0;
  const float* gains = nullptr;
  int64_t num_gains = 0;
  int64_t num_activation_rows() const { return num_row_begin - 1; }
};

// Checks a grouping from outside before the lookup reads through it: row_begin starts at 0, never
// decreases and ends at the entry count, rows and gains have that many entries, and every row lies
// in [0, table_rows). InvalidArgument naming the table and the argument otherwise.
Status ValidateGroupedEntries(const GroupedEntries& entries, int64_t table_rows,
                              const std::string& table_name);

// activations[a] = sum over a's entries of gain * table[row] (Row as in SparseDenseMatmul:
// float, Bfloat16 or Float16, read as float32), for every activation row; `entries` must have
// passed ValidateGroupedEntries. `activations` is [num_activation_rows, dim] and is overwritten.
template <typename Row>
void SparseDenseMatmulGrouped(const GroupedEntries& entries, const Row* table, int64_t dim,
                              float* activations, const ParallelFor& parallel_for,
                              VectorIsa isa = BestVectorIsa());

}  // namespace sce

#endif  // SCE_CORE_GROUPED_ENTRIES_H_
