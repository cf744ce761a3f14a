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
// columns and steps differ in many bits.
uint64_t RoundingBits(uint64_t seed, int64_t row, int64_t column, int64_t step);

// bfloat16: the upper 16 bits of a float32 (8 exponent bits, 7 mantissa bits).
float Bfloat16ToFloat(uint16_t value);
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

}  // namespace sce

#endif  // SCE_CORE_ROW_PRECISION_H_
