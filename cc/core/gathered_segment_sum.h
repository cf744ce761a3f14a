// Weighted gather + segment sum of rows, out[segments[i]] += gains[i] * rows[positions[i]]: the
// combine step of the all-to-all exchange (docs/multi_worker.md#exchange) in both directions.
//
// Forward, a replica turns the unique rows it received from their owners into activations
// (rows = unique rows, positions = each id's unique row, segments = each id's sample). Backward it
// reduces activation gradients to one gradient row per unique id, which is the same operation
// with positions and segments swapped. TensorFlow spells it gather, multiply and
// unsorted_segment_sum: three ops, an [ids, width] intermediate and a single-threaded scatter.
//
// Every entry is added in entry order within its segment, starting from zero, and each
// contribution is the product gains[i] * rows[positions[i]][d] rounded to float before the add
// (the library builds with -ffp-contract=off), so the result equals TensorFlow's three ops bit for
// bit.
#ifndef SCE_CORE_GATHERED_SEGMENT_SUM_H_
#define SCE_CORE_GATHERED_SEGMENT_SUM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/parallel.h"
#include "cc/core/status.h"
#include "cc/core/vector_isa.h"

namespace sce {

struct GatheredSegmentSumArgs {
  const float* rows = nullptr;  // [num_rows, width], row-major
  int64_t num_rows = 0;
  int64_t width = 0;
  const int32_t* positions = nullptr;  // [num_entries]: row of each entry
  const float* gains = nullptr;        // [num_entries]: weight of each entry
  const int32_t* segments = nullptr;   // [num_entries]: output row of each entry
  int64_t num_entries = 0;
  int64_t num_segments = 0;            // output rows
  // Optional row tables, for rows and outputs that are not one matrix (the exchange's activations
  // and activation gradients are one tensor per feature): when set, row r of `rows` is
  // row_table[r] ([num_rows] pointers to `width` floats; `rows` is then unused) and output row s
  // is out_table[s] ([num_segments] pointers to distinct rows; `out` is then unused).
  const float* const* row_table = nullptr;
  float* const* out_table = nullptr;
};

// Checks sizes (the output [num_segments, width] within kMaxAllocationElements) and that every
// position is in [0, num_rows) and every segment in [0, num_segments). `where` prefixes messages,
// e.g. "table 'video'". Nothing is written; call before allocating the output.
Status ValidateGatheredSegmentSum(const GatheredSegmentSumArgs& args, const std::string& where);

// Writes out[num_segments, width] (or the rows of out_table); rows without entries are zero.
// Requires a validated `args`. Output rows are split into at most `max_ranges` ranges that run
// in parallel, so no two threads write one row and the order within a row is fixed. With
// unsorted segments (backward) each range reads every entry's segment and adds the entries that
// fall in it, so pass the number of threads that will run them (more ranges than threads only
// add reads); with nondecreasing segments (forward) a range finds its run of entries by binary
// search and stores each row's first entry instead of zero-filling and adding. `isa` picks the instruction set
// (default: the widest the CPU has; every version gives the same bits); one the CPU lacks runs
// as UsableIsa (vector_isa.h) says.
void GatheredSegmentSum(const GatheredSegmentSumArgs& args, float* out,
                        const ParallelFor& parallel_for, int64_t max_ranges,
                        VectorIsa isa = BestVectorIsa());

// The row tables of a stacked table's activations held as one matrix per feature
// (docs/lookup.md#activation-row-order): stacked row s * M + start_f + k (SparseCore s, feature f
// at offset start_f of the SparseCore's M rows, k < rows_per_sc[f]) is row s * rows_per_sc[f] + k
// of feature f's [S * rows_per_sc[f], width] matrix. CheckFeatureBlocks validates the sizes
// (S >= 1, rows >= 0, S * M within int32 and kMaxAllocationElements: a row table holds one pointer
// per stacked row) and gives S * M.
Status CheckFeatureBlocks(int64_t sparse_cores, const std::vector<int64_t>& rows_per_sc,
                          const std::string& where, int64_t* stacked_rows);

template <typename T>
void FeatureRowTable(int64_t sparse_cores, const std::vector<int64_t>& rows_per_sc,
                     const std::vector<T*>& features, int64_t width, std::vector<T*>* table) {
  table->clear();
  for (int64_t s = 0; s < sparse_cores; ++s) {
    for (size_t f = 0; f < rows_per_sc.size(); ++f) {
      T* row = features[f] + s * rows_per_sc[f] * width;
      for (int64_t k = 0; k < rows_per_sc[f]; ++k, row += width) table->push_back(row);
    }
  }
}

}  // namespace sce

#endif  // SCE_CORE_GATHERED_SEGMENT_SUM_H_
