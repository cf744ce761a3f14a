// The initial values of a row an open-vocabulary table gives to a new key
// (docs/dynamic_vocabulary.md#new-rows). They are a function of the table's seed and the key
// only, computed element by element in double precision, so they do not depend on the step, the
// order of admission, the replica that holds the key or how many rows are drawn at once.
#ifndef SCE_CC_CORE_KEY_VALUES_H_
#define SCE_CC_CORE_KEY_VALUES_H_

#include <cstdint>

namespace sce {

// A number in (0, 1) that depends only on (seed, key, column): 23 bits of a 64-bit mix, as
// (2k + 1) / 2^24, exact in float and never 0 or 1.
float KeyedUniform(uint64_t seed, uint64_t key, int64_t column);

// The inverse of the standard normal distribution function, for p in (0, 1): a rational
// approximation refined by one Halley step on std::erfc (about 1e-15 relative error).
double InverseNormal(double p);

enum class KeyedDistribution {
  kUniform,           // low + (high - low) * u                        (a = low, b = high)
  kNormal,            // mean + stddev * InverseNormal(u)               (a = mean, b = stddev)
  kTruncatedNormal,   // the same within two standard deviations        (a = mean, b = stddev)
};

// out[i * width + j]: the value of keys[i] in column j under `distribution`, from
// KeyedUniform(seed, keys[i], j).
void KeyedRandomRows(uint64_t seed, const uint64_t* keys, int64_t n, int64_t width,
                     KeyedDistribution distribution, double a, double b, float* out);

}  // namespace sce

#endif  // SCE_CC_CORE_KEY_VALUES_H_
