#include "cc/core/key_values.h"

#include <cmath>

#include "cc/core/key_hash.h"

namespace sce {
namespace {

constexpr uint64_t kValueSalt = 0x94d049bb133111ebULL;
constexpr uint64_t kColumnMultiplier = 0xc2b2ae3d27d4eb4fULL;
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kSqrt2Pi = 2.50662827463100050242;

inline float UniformOfKeyMix(uint64_t seed, uint64_t key_mix, int64_t column) {
  const uint64_t z = Mix64(key_mix ^ seed ^ (static_cast<uint64_t>(column) * kColumnMultiplier));
  return static_cast<float>(2 * (z >> 41) + 1) * (1.0f / 16777216.0f);
}

// The standard normal distribution function.
inline double NormalCdf(double x) { return 0.5 * std::erfc(-x / kSqrt2); }

}  // namespace

float KeyedUniform(uint64_t seed, uint64_t key, int64_t column) {
  return UniformOfKeyMix(seed, Mix64(key ^ kValueSalt), column);
}

double InverseNormal(double p) {
  // P. J. Acklam's rational approximations (relative error below 1.2e-9) for the central region
  // and the two tails.
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                             -2.759285104469687e+02, 1.383577518672690e+02,
                             -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                             -1.556989798598866e+02, 6.680131188771972e+01,
                             -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                             -2.400758277161838e+00, -2.549732539343734e+00,
                             4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                             2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  double x;
  if (p < kLow || p > 1.0 - kLow) {
    const double q = std::sqrt(-2.0 * std::log(p < kLow ? p : 1.0 - p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    if (p > 1.0 - kLow) x = -x;
  } else {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  // One step of Halley's method on NormalCdf(x) = p.
  const double e = NormalCdf(x) - p;
  const double u = e * kSqrt2Pi * std::exp(0.5 * x * x);
  return x - u / (1.0 + 0.5 * x * u);
}

void KeyedRandomRows(uint64_t seed, const uint64_t* keys, int64_t n, int64_t width,
                     KeyedDistribution distribution, double a, double b, float* out) {
  // TruncatedNormal keeps the probabilities within two standard deviations of the mean.
  const double edge = NormalCdf(-2.0);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key_mix = Mix64(keys[i] ^ kValueSalt);
    for (int64_t j = 0; j < width; ++j) {
      const double u = UniformOfKeyMix(seed, key_mix, j);
      double value;
      switch (distribution) {
        case KeyedDistribution::kUniform:
          value = a + (b - a) * u;
          break;
        case KeyedDistribution::kNormal:
          value = a + b * InverseNormal(u);
          break;
        case KeyedDistribution::kTruncatedNormal:
        default:
          value = a + b * InverseNormal(edge + (1.0 - 2.0 * edge) * u);
          break;
      }
      out[i * width + j] = static_cast<float>(value);
    }
  }
}

}  // namespace sce
