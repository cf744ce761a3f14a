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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sce {

// Whether this CPU runs the AVX-512 (F) versions below; checked once.
bool CpuHasAvx512F();

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

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build some intrinsics (_mm512_alignr_epi32 among them) on a
// deliberately undefined vector, unused under their full mask, which -W(maybe-)uninitialized
// reports wherever they are inlined: silenced for the vector code only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The gains of a block of 16 weights `w` in which bit k of `merges` marks a lane that merges into
// the entry before it (the lane before, or for a run at the block's start the last entry already
// written, whose gain is *last). Adds that leading run to *last, one weight at a time, and returns
// every kept lane's gain: its weight plus those of the merged lanes after it, added one lane at a
// time in input order, the order of the scalar merge. The loop runs as often as the longest run of
// merges. Shared by the two AVX-512 merges (adjacent_merge.cc, minibatch_splits.cc).
__attribute__((target("avx512f"), always_inline)) inline __m512 SumMergedRunsAvx512(
    __m512 w, unsigned merges, float* last) {
  if (merges == 0) return w;
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, w);
  for (int k = 0; k < 16 && ((merges >> k) & 1); ++k) *last += lanes[k];
  __m512 sums = w;
  __m512i following = _mm512_castps_si512(w);
  unsigned continuing = merges >> 1;  // lanes whose next j lanes all merge into them
  for (int j = 1; continuing != 0; ++j) {
    following = _mm512_alignr_epi32(_mm512_setzero_si512(), following, 1);  // lane k: w[k + j]
    sums = _mm512_mask_add_ps(sums, static_cast<__mmask16>(continuing), sums,
                              _mm512_castsi512_ps(following));
    continuing &= merges >> (j + 1);
  }
  return sums;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // defined(__x86_64__)

}  // namespace sce

#endif  // SCE_CORE_ADJACENT_MERGE_H_
