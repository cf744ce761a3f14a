// What the hand-vectorized AVX-512 loops share (adjacent_merge.cc, minibatch_splits.cc). Each such
// loop is a function built with __attribute__((target("avx512f"))) next to a portable version,
// picked at run time by CpuHasAvx512F() (vector_isa.h): the library itself is built for the
// baseline x86-64 ISA. Everything here is x86-64 only.
#ifndef SCE_CORE_AVX512_H_
#define SCE_CORE_AVX512_H_

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 headers build some intrinsics (_mm512_alignr_epi32, _mm512_permutexvar_epi32)
// on a deliberately undefined vector, unused under their full mask, which -W(maybe-)uninitialized
// reports wherever they are inlined. Vector code goes between these two markers, which silence
// exactly that for it.
#if defined(__GNUC__) && !defined(__clang__)
#define SCE_AVX512_CODE_BEGIN                                   \
  _Pragma("GCC diagnostic push")                                \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")   \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define SCE_AVX512_CODE_END _Pragma("GCC diagnostic pop")
#else
#define SCE_AVX512_CODE_BEGIN
#define SCE_AVX512_CODE_END
#endif

namespace sce {

SCE_AVX512_CODE_BEGIN

// Lane 15 of v.
__attribute__((target("avx512f"), always_inline)) inline int32_t LastLane(__m512i v) {
  return _mm512_cvtsi512_si32(_mm512_alignr_epi32(v, v, 15));
}

// The gains of a block of 16 weights `w` in which bit k of `merges` marks a lane that merges into
// the entry before it (the lane before, or for a run at the block's start the last entry already
// written, whose gain is *last). Adds that leading run to *last, one weight at a time, and returns
// every kept lane's gain: its weight plus those of the merged lanes after it, added one lane at a
// time in input order, the order of the scalar merges. The loop runs as often as the longest run
// of merges.
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

SCE_AVX512_CODE_END

}  // namespace sce

#endif  // defined(__x86_64__)

#endif  // SCE_CORE_AVX512_H_
