// 16-bit table rows (issue 33): bfloat16 and float16 values, read into float32 and written back
// from float32 either to the nearest value or with stochastic rounding.
//
// Stochastic rounding rounds x to one of its two 16-bit neighbours lo <= x <= hi, choosing hi
// with probability (x - lo) / (hi - lo), so E[round(x)] = x: repeated updates smaller than half a
// step, which rounding to nearest would drop every time, move the value by their true amount on
// average. The random bits are a pure function of (table seed, logical row, column, step)
// (RoundingBits), never of a thread, a shard or a replica, so a run is bit-identical on any
// topology and after a restore that brings back the step.
#ifndef SCE_CORE_ROW_PRECISION_H_
#define SCE_CORE_ROW_PRECISION_H_

#include <cstdint>

namespace sce {

// Table row element types. A table variable holds one of them; the kernels read every element
// as float32 (`RowValue`), and the optimizer writes float32 results back (row_precision.cc).
struct Bfloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

// 64 well-mixed bits of (seed, row, column, step): SplitMix64's finalizer over a combination of
// the four inputs, each first multiplied by a distinct odd constant so that neighbouring rows,
// columns and steps differ in many bits. The combination is an exclusive or, so the part of one
// row and step (RowRoundingKey) is computed once per row and each column word adds its own.
constexpr uint64_t kRoundingRowMultiplier = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kRoundingColumnMultiplier = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kRoundingStepMultiplier = 0x165667b19e3779f9ull;

__attribute__((always_inline)) inline uint64_t RowRoundingKey(uint64_t seed, int64_t row,
                                                              int64_t step) {
  return seed ^ (static_cast<uint64_t>(row) * kRoundingRowMultiplier) ^
         (static_cast<uint64_t>(step) * kRoundingStepMultiplier);
}
__attribute__((always_inline)) inline uint64_t ColumnWordRoundingBits(uint64_t row_key,
                                                                      int64_t column) {
  uint64_t z = row_key ^ (static_cast<uint64_t>(column) * kRoundingColumnMultiplier);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t RoundingBits(uint64_t seed, int64_t row, int64_t column, int64_t step) {
  return ColumnWordRoundingBits(RowRoundingKey(seed, row, step), column);
}

// bfloat16: the upper 16 bits of a float32 (8 exponent bits, 7 mantissa bits).
float Bfloat16ToFloat(uint16_t value);
// The one bfloat16 rounding rule, branch-free so that row loops vectorize it: float32 bits `bits`
// plus `addend` below the kept 16 bits (a uniform 16-bit number: stochastic rounding; 0x7fff plus
// the kept part's lowest bit: to nearest, ties to even), then truncated. NaN stays NaN (quiet) and
// infinities stay infinities. Sets *overflow (to 1) when a finite value becomes an infinity.
__attribute__((always_inline)) inline uint16_t RoundBfloat16Bits(uint32_t bits, uint32_t addend,
                                                                 uint32_t* overflow) {
  const uint32_t special = (bits & 0x7f800000u) == 0x7f800000u;  // NaN or infinity
  const uint32_t rounded = (bits + addend) >> 16;
  const uint32_t kept = (bits >> 16) | ((bits & 0x7fffffu) != 0 ? 0x40u : 0u);  // NaN quiet
  *overflow |= (special ^ 1u) & static_cast<uint32_t>((rounded & 0x7fffu) == 0x7f80u);
  return static_cast<uint16_t>(special ? kept : rounded);
}
__attribute__((always_inline)) inline uint32_t NearestBfloat16Addend(uint32_t bits) {
  return 0x7fffu + ((bits >> 16) & 1u);
}
// Round to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinities.
uint16_t FloatToBfloat16Nearest(float value);
// Stochastic rounding with the low 16 of `random_bits`; NaN and infinities as above. A finite
// value at most one bfloat16 step below the largest finite float32 may round to infinity: the
// caller checks the result (`*overflow` is set when a finite input gives an infinity).
uint16_t FloatToBfloat16Stochastic(float value, uint64_t random_bits, bool* overflow);

// float16 (IEEE binary16: 5 exponent bits, 10 mantissa bits, subnormals down to 2^-24).
float Float16ToFloat(uint16_t value);
// Round to nearest, ties to even; `*overflow` is set when a finite input is beyond the largest
// finite float16 (65504) after rounding (the result is then infinity).
uint16_t FloatToFloat16Nearest(float value, bool* overflow);
// Stochastic rounding with 24 of `random_bits` (subnormals included); `*overflow` as above.
uint16_t FloatToFloat16Stochastic(float value, uint64_t random_bits, bool* overflow);

// The random bits of element `column` of a row: one RoundingBits word serves several columns
// (bfloat16 needs 16 bits, float16 24), so a row of 32 bfloat16 values costs 8 hashes, not 32.
// Still a pure function of (seed, row, column, step).
template <typename Row>
struct RoundingBitsLayout;
template <>
struct RoundingBitsLayout<Bfloat16> {
  static constexpr int64_t kColumnsPerWord = 4;
  static constexpr int kShift = 16;
};
template <>
struct RoundingBitsLayout<Float16> {
  static constexpr int64_t kColumnsPerWord = 2;
  static constexpr int kShift = 32;
};
template <typename Row>
uint64_t ColumnRoundingBits(uint64_t seed, int64_t row, int64_t column, int64_t step) {
  using L = RoundingBitsLayout<Row>;
  return RoundingBits(seed, row, column / L::kColumnsPerWord, step) >>
         (L::kShift * (column % L::kColumnsPerWord));
}

// One element of a row as float32. Inline and branch-free for float32 and bfloat16 (a shift), so
// the row loops that call it still vectorize; float16 goes through Float16ToFloat.
__attribute__((always_inline)) inline float RowValue(const float* p) { return *p; }
__attribute__((always_inline)) inline float RowValue(const Bfloat16* p) {
  const uint32_t bits = static_cast<uint32_t>(p->bits) << 16;
  float value;
  __builtin_memcpy(&value, &bits, sizeof(value));
  return value;
}
__attribute__((always_inline)) inline float RowValue(const Float16* p) {
  return Float16ToFloat(p->bits);
}

// The RoundingBits words of a row of `dim` columns (ColumnWordRoundingBits of words
// 0 .. RoundingWords<Row>(dim) - 1 for `row_key`, RowRoundingKey): a loop of independent hashes,
// which the fused update runs for a block of rows at once (fused_update.h, ApplyRowSums).
template <typename Row>
constexpr int64_t RoundingWords(int64_t dim) {
  return (dim + RoundingBitsLayout<Row>::kColumnsPerWord - 1) /
         RoundingBitsLayout<Row>::kColumnsPerWord;
}
template <typename Row, int64_t kDim>
__attribute__((always_inline)) inline void FillRoundingWords(uint64_t row_key, int64_t runtime_dim,
                                                             uint64_t* words) {
  const int64_t n = RoundingWords<Row>(kDim > 0 ? kDim : runtime_dim);
  for (int64_t w = 0; w < n; ++w) words[w] = ColumnWordRoundingBits(row_key, w);
}

// The 16 random bits of bfloat16 column j: bits [16 (j % 4), 16 (j % 4) + 16) of word j / 4
// (ColumnRoundingBits<Bfloat16>). On a little-endian host that is element j of the words read as
// 16-bit numbers, a plain load that the row loop vectorizes; elsewhere the shift.
__attribute__((always_inline)) inline uint32_t Bfloat16ColumnAddend(const uint64_t* words,
                                                                    int64_t j) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint16_t bits;
  __builtin_memcpy(&bits, reinterpret_cast<const char*>(words) + 2 * j, sizeof(bits));
  return bits;
#else
  return static_cast<uint32_t>(words[j / 4] >> (16 * (j % 4))) & 0xffffu;
#endif
}

// Rounds a row of float32 values `wide[0:dim]` to bfloat16 into `out[0:dim]` (RoundBfloat16Bits):
// stochastically with the row's words (FillRoundingWords; column j takes 16 bits of word j / 4,
// as ColumnRoundingBits<Bfloat16>), or to nearest when `words` is null. Returns whether a finite
// value became an infinity (stochastic rounding only, as FloatToBfloat16Stochastic). kDim > 0
// fixes dim at compile time (vector_isa.h).
//
// A first pass adds the rounding bits and truncates, which is RoundBfloat16Bits for every finite
// value that stays finite; it also notes whether any value was a NaN or an infinity or became
// one. Only such a row (an overflow, or a non-finite value, which the update loops never write
// in normal training) is rounded again value by value with RoundBfloat16Bits, so the bits are
// the same either way, and the common row costs a few vector instructions per 16 values.
template <int64_t kDim>
__attribute__((always_inline)) inline bool RoundRow(const float* wide, int64_t runtime_dim,
                                                    const uint64_t* words, Bfloat16* out) {
  using L = RoundingBitsLayout<Bfloat16>;
  static_assert(L::kShift == 16 && L::kColumnsPerWord == 4,
                "a bfloat16 value takes 16 bits of its word");
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  const bool stochastic = words != nullptr;
  uint32_t exponent_all_ones = 0;  // a NaN or infinity in or out
  for (int64_t j = 0; j < dim; ++j) {
    uint32_t bits;
    __builtin_memcpy(&bits, wide + j, sizeof(bits));
    const uint32_t addend =
        stochastic ? Bfloat16ColumnAddend(words, j) : NearestBfloat16Addend(bits);
    const uint32_t rounded = (bits + addend) >> 16;
    exponent_all_ones |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u) |
                         static_cast<uint32_t>((rounded & 0x7f80u) == 0x7f80u);
    out[j].bits = static_cast<uint16_t>(rounded);
  }
  if (exponent_all_ones == 0) return false;
  uint32_t overflow = 0;
  for (int64_t j = 0; j < dim; ++j) {
    uint32_t bits;
    __builtin_memcpy(&bits, wide + j, sizeof(bits));
    const uint32_t addend =
        stochastic ? Bfloat16ColumnAddend(words, j) : NearestBfloat16Addend(bits);
    out[j].bits = RoundBfloat16Bits(bits, addend, &overflow);
  }
  return stochastic && overflow != 0;
}

// The same for float16 (scalar: FloatToFloat16Stochastic / FloatToFloat16Nearest per value;
// column j takes 32 bits of word j / 2).
template <int64_t kDim>
inline bool RoundRow(const float* wide, int64_t runtime_dim, const uint64_t* words,
                     Float16* out) {
  using L = RoundingBitsLayout<Float16>;
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  bool overflow = false;
  for (int64_t j = 0; j < dim; ++j) {
    out[j].bits = words == nullptr
                      ? FloatToFloat16Nearest(wide[j], &overflow)
                      : FloatToFloat16Stochastic(
                            wide[j],
                            words[j / L::kColumnsPerWord] >> (L::kShift * (j % L::kColumnsPerWord)),
                            &overflow);
  }
  return overflow;
}

}  // namespace sce

#endif  // SCE_CORE_ROW_PRECISION_H_
