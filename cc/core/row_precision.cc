#include "cc/core/row_precision.h"

#include <cmath>
#include <cstring>

namespace sce {
namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

constexpr uint16_t kFloat16Infinity = 0x7c00;
constexpr uint16_t kFloat16QuietNan = 0x7e00;
constexpr float kFloat16Max = 65504.0f;

// |value| as a float16 bit pattern, for |value| a multiple of the float16 step at its magnitude
// (exactly representable) and at most kFloat16Max.
uint16_t ExactFloat16Magnitude(float magnitude) {
  if (magnitude == 0.0f) return 0;
  int exponent;
  const float mantissa = std::frexp(magnitude, &exponent);  // magnitude = mantissa * 2^exponent
  // float16 normals: 2^-14 <= magnitude, i.e. exponent >= -13 with mantissa in [0.5, 1).
  if (exponent < -13) {
    return static_cast<uint16_t>(std::ldexp(magnitude, 24));  // subnormal: units of 2^-24
  }
  const uint32_t fraction = static_cast<uint32_t>(std::ldexp(mantissa, 11)) - 1024;  // 10 bits
  const uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  return static_cast<uint16_t>((biased << 10) | fraction);
}

// The float16 step at |value| (finite, at most the largest float16): 2^-24 for subnormals.
float Float16Step(float magnitude) {
  if (magnitude < std::ldexp(1.0f, -14)) return std::ldexp(1.0f, -24);
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  return std::ldexp(1.0f, exponent - 1 - 10);
}

// Rounds |value| (finite) to a float16 magnitude: down, or up to the next step when
// `round_up(fraction)` says so, where fraction in [0, 1) is the part of a step above the lower
// neighbour. Sets *overflow and returns infinity beyond kFloat16Max.
template <typename RoundUp>
uint16_t RoundFloat16Magnitude(float magnitude, bool* overflow, RoundUp round_up) {
  if (magnitude > kFloat16Max + std::ldexp(1.0f, 4)) {  // past the last step (16 wide)
    *overflow = true;
    return kFloat16Infinity;
  }
  const float step = Float16Step(std::fmin(magnitude, kFloat16Max));
  const float units = magnitude / step;  // exact: step is a power of two
  const float lower = std::floor(units);
  const bool up = round_up(units - lower, static_cast<uint64_t>(lower));
  const float rounded = (lower + (up ? 1.0f : 0.0f)) * step;
  if (rounded > kFloat16Max) {
    *overflow = true;
    return kFloat16Infinity;
  }
  return ExactFloat16Magnitude(rounded);
}

}  // namespace

float Bfloat16ToFloat(uint16_t value) { return FromBits(static_cast<uint32_t>(value) << 16); }

uint16_t FloatToBfloat16Nearest(float value) {
  const uint32_t bits = Bits(value);
  uint32_t unused = 0;  // a finite value past bfloat16's range rounds to infinity, unflagged
  return RoundBfloat16Bits(bits, NearestBfloat16Addend(bits), &unused);
}

uint16_t FloatToBfloat16Stochastic(float value, uint64_t random_bits, bool* overflow) {
  // Sign and magnitude: adding r in [0, 2^16) to the magnitude's low 16 bits carries into the
  // kept bits with probability (low bits) / 2^16, which is (x - lo) / (hi - lo) in every binade.
  uint32_t overflowed = 0;
  const uint16_t out =
      RoundBfloat16Bits(Bits(value), static_cast<uint32_t>(random_bits & 0xffffu), &overflowed);
  if (overflowed != 0) *overflow = true;
  return out;
}

float Float16ToFloat(uint16_t value) {
  const uint32_t sign = (value & 0x8000u) ? 1u : 0u;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t fraction = value & 0x3ffu;
  float magnitude;
  if (exponent == 0x1fu) {
    magnitude = fraction ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(fraction), -24);
  } else {
    magnitude = std::ldexp(static_cast<float>(fraction + 1024), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t FloatToFloat16Nearest(float value, bool* overflow) {
  if (std::isnan(value)) return kFloat16QuietNan;
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isinf(value)) return sign | kFloat16Infinity;
  const uint16_t magnitude = RoundFloat16Magnitude(
      std::fabs(value), overflow, [](float fraction, uint64_t lower) {
        return fraction > 0.5f || (fraction == 0.5f && (lower & 1u));
      });
  return sign | magnitude;
}

uint16_t FloatToFloat16Stochastic(float value, uint64_t random_bits, bool* overflow) {
  if (std::isnan(value)) return kFloat16QuietNan;
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isinf(value)) return sign | kFloat16Infinity;
  // fraction has at most 24 significant bits below the binary point (a float32 mantissa), so
  // comparing it with a uniform 24-bit number rounds up with probability exactly `fraction`.
  const float uniform = std::ldexp(static_cast<float>(random_bits & 0xffffffu), -24);
  const uint16_t magnitude = RoundFloat16Magnitude(
      std::fabs(value), overflow,
      [uniform](float fraction, uint64_t /*lower*/) { return uniform < fraction; });
  return sign | magnitude;
}

}  // namespace sce
