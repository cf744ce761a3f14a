#include "cc/core/adjacent_merge.h"

#include "cc/core/avx512.h"

namespace sce {

namespace {

// The scalar merge from position i to `end`, given the entries written so far (`count`) and the
// previous id's sample and id (-1, which matches no sample, before the first). Returns the entry
// count; ORs the range check into *bad.
__attribute__((always_inline)) inline int64_t MergeScalar(
    const int32_t* values, const float* weights, bool per_id_weights, int64_t i, int64_t end,
    uint32_t bound, int32_t prev_row, int32_t prev_col, int64_t count, int32_t* rows,
    int32_t* cols, float* gains, bool* bad) {
  uint32_t flagged = 0;
  for (; i < end; ++i) {
    const int32_t row = rows[i];
    const int32_t col = values[i];
    flagged |= static_cast<uint32_t>(col) >= bound;
    const float w = per_id_weights ? weights[i] : weights[0];
    if (row == prev_row && col == prev_col) {
      gains[count - 1] += w;
      continue;
    }
    rows[count] = row;
    cols[count] = col;
    gains[count] = w;
    ++count;
    prev_row = row;
    prev_col = col;
  }
  *bad = *bad || flagged != 0;
  return count;
}

}  // namespace

void PrefixSumInPlaceBaseline(int32_t* x, int64_t n) {
  int32_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    x[i] = sum;
  }
}

int64_t MergeAdjacentDuplicatesBaseline(const int32_t* values, const float* weights,
                                        bool per_id_weights, int64_t n, uint32_t bound,
                                        int32_t* rows, int32_t* cols, float* gains, bool* bad) {
  *bad = false;
  return MergeScalar(values, weights, per_id_weights, 0, n, bound, -1, -1, 0, rows, cols, gains,
                     bad);
}

#if defined(__x86_64__)
SCE_AVX512_CODE_BEGIN

// 16 elements at a time: a scan inside the register (4 shifted adds) plus the running total,
// instead of one dependent add per element.
__attribute__((target("avx512f"))) void PrefixSumInPlaceAvx512(int32_t* x, int64_t n) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i total = zero;  // every lane: the sum of the blocks before
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i v = _mm512_loadu_si512(x + i);
    // alignr(v, zero, 16 - k) moves v up by k lanes, zeros coming in.
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, zero, 15));
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, zero, 14));
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, zero, 12));
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, zero, 8));
    v = _mm512_add_epi32(v, total);
    _mm512_storeu_si512(x + i, v);
    total = _mm512_permutexvar_epi32(_mm512_set1_epi32(15), v);
  }
  int32_t sum = _mm512_cvtsi512_si32(total);
  for (; i < n; ++i) {
    sum += x[i];
    x[i] = sum;
  }
}

// 16 ids at a time. A block's (sample, id) pairs are compared with their predecessors in
// registers, which gives the lanes that merge into the entry before them; SumMergedRunsAvx512
// (avx512.h) adds their weights in input order. The kept lanes are then packed to the front
// (vpcompressd between registers: its memory form is slow on AMD Zen 4) and stored as a whole
// vector at `count` <= i: the lanes after them land no further than the block's last position,
// whose input is already in registers, and are overwritten later or lie past the final count.
__attribute__((target("avx512f"))) int64_t MergeAdjacentDuplicatesAvx512(
    const int32_t* values, const float* weights, bool per_id_weights, int64_t n, uint32_t bound,
    int32_t* rows, int32_t* cols, float* gains, bool* bad) {
  *bad = false;
  int64_t count = 0, i = 0;
  // The previous block's samples and ids: lane 15 precedes the next block's lane 0 (-1, which
  // matches no sample, before the first block, so the first id always starts an entry).
  __m512i previous_rows = _mm512_set1_epi32(-1), previous_cols = _mm512_set1_epi32(-1);
  const __m512i bounds = _mm512_set1_epi32(static_cast<int32_t>(bound));
  const __m512 same_weight = _mm512_set1_ps(per_id_weights || n == 0 ? 0.0f : weights[0]);
  __mmask16 flagged = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i r = _mm512_loadu_si512(rows + i);
    const __m512i c = _mm512_loadu_si512(values + i);
    const __m512 w = per_id_weights ? _mm512_loadu_ps(weights + i) : same_weight;
    flagged |= _mm512_cmpge_epu32_mask(c, bounds);
    // Lane k of alignr(v, previous, 15) is element i + k - 1.
    const unsigned merges =
        _mm512_cmpeq_epi32_mask(r, _mm512_alignr_epi32(r, previous_rows, 15)) &
        _mm512_cmpeq_epi32_mask(c, _mm512_alignr_epi32(c, previous_cols, 15));
    previous_rows = r;
    previous_cols = c;
    // The first id of all never merges (-1 above), so an entry exists when a block starts with a
    // merge.
    const __m512 sums = SumMergedRunsAvx512(w, merges, gains + (count > 0 ? count - 1 : 0));
    const __mmask16 kept = static_cast<__mmask16>(~merges);
    _mm512_storeu_si512(rows + count, _mm512_maskz_compress_epi32(kept, r));
    _mm512_storeu_si512(cols + count, _mm512_maskz_compress_epi32(kept, c));
    _mm512_storeu_ps(gains + count, _mm512_maskz_compress_ps(kept, sums));
    count += __builtin_popcount(static_cast<unsigned>(kept));
  }
  count = MergeScalar(values, weights, per_id_weights, i, n, bound, LastLane(previous_rows),
                      LastLane(previous_cols), count, rows, cols, gains, bad);
  *bad = *bad || flagged != 0;
  return count;
}
SCE_AVX512_CODE_END
#else
void PrefixSumInPlaceAvx512(int32_t* x, int64_t n) { PrefixSumInPlaceBaseline(x, n); }

int64_t MergeAdjacentDuplicatesAvx512(const int32_t* values, const float* weights,
                                      bool per_id_weights, int64_t n, uint32_t bound,
                                      int32_t* rows, int32_t* cols, float* gains, bool* bad) {
  return MergeAdjacentDuplicatesBaseline(values, weights, per_id_weights, n, bound, rows, cols,
                                         gains, bad);
}
#endif  // defined(__x86_64__)

void PrefixSumInPlace(int32_t* x, int64_t n) {
  if (CpuHasAvx512F()) return PrefixSumInPlaceAvx512(x, n);
  PrefixSumInPlaceBaseline(x, n);
}

int64_t MergeAdjacentDuplicates(const int32_t* values, const float* weights, bool per_id_weights,
                                int64_t n, uint32_t bound, int32_t* rows, int32_t* cols,
                                float* gains, bool* bad) {
  auto* merge = CpuHasAvx512F() ? &MergeAdjacentDuplicatesAvx512 : &MergeAdjacentDuplicatesBaseline;
  return merge(values, weights, per_id_weights, n, bound, rows, cols, gains, bad);
}

}  // namespace sce
