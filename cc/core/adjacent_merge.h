// The two per-id passes of the sum combiner's COO conversion
// (docs/preprocessing.md#coo-conversion), vectorized: each id's sample from the ragged row_splits
// (a prefix sum), and the merge of adjacent duplicate (sample, id) pairs into one entry.
//
// They run once per id per step for every feature, so each has an AVX-512 version next to the
// portable one, picked at run time (the library is built for the baseline x86-64 ISA, with no
// -march). Both versions give the same results bit for bit (a NaN gain is a NaN in both, its
// payload aside): integer sums, and the merged gains added one weight at a time in input order.
// The portable versions are the specification; the tests and fuzz/fuzz_adjacent_merge.cc compare
// the two.
#ifndef SCE_CORE_ADJACENT_MERGE_H_
#define SCE_CORE_ADJACENT_MERGE_H_

#include <cstdint>

#include "cc/core/vector_isa.h"  // CpuHasAvx512F

namespace sce {

// x[i] becomes x[0] + ... + x[i]. The sums must fit in int32 (here they are sample numbers).
void PrefixSumInPlace(int32_t* x, int64_t n);
void PrefixSumInPlaceBaseline(int32_t* x, int64_t n);
void PrefixSumInPlaceAvx512(int32_t* x, int64_t n);  // only where CpuHasAvx512F()

// Merges rows[0, n) (each id's sample, >= 0) and values[0, n) (the ids): a run of adjacent equal
// (sample, id) pairs becomes one entry whose gain is the sum of the run's weights, added in input
// order (weights[i] with per_id_weights, else weights[0] for every id; weights is read only when
// n > 0). Writes the entries to rows / cols / gains (rows in place: an entry is written at or
// before the position it is read from; each buffer holds n) and returns their number. Sets *bad
// to whether any id, as unsigned, is >= `bound` (so negative ids count as out of range for any
// bound <= 2^31). What the buffers hold past the returned count differs between the versions.
int64_t MergeAdjacentDuplicates(const int32_t* values, const float* weights, bool per_id_weights,
                                int64_t n, uint32_t bound, int32_t* rows, int32_t* cols,
                                float* gains, bool* bad);
int64_t MergeAdjacentDuplicatesBaseline(const int32_t* values, const float* weights,
                                        bool per_id_weights, int64_t n, uint32_t bound,
                                        int32_t* rows, int32_t* cols, float* gains, bool* bad);
// Only where CpuHasAvx512F().
int64_t MergeAdjacentDuplicatesAvx512(const int32_t* values, const float* weights,
                                      bool per_id_weights, int64_t n, uint32_t bound,
                                      int32_t* rows, int32_t* cols, float* gains, bool* bad);

}  // namespace sce

#endif  // SCE_CORE_ADJACENT_MERGE_H_
