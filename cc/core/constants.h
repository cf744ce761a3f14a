// Constants and small integer helpers shared by the SparseCore layout and buffer formats.
#ifndef SCE_CORE_CONSTANTS_H_
#define SCE_CORE_CONSTANTS_H_

#include <cstdint>
#include <limits>

namespace sce {

// Value written into padding slots of the int32 CSR buffers (float buffers hold float(kPad)).
constexpr int32_t kPad = std::numeric_limits<int32_t>::max();
// Every segment and row-pointer block of the CSR buffers is aligned to this many entries.
constexpr int64_t kXlaPadSize = 8;
// Default number of minibatch division levels (2^6 = 64 vocabulary divisions).
constexpr int kDefaultMaxDivisionLevel = 6;
// SparseCores per replica when the caller does not say (TF reads this from the TPU topology).
constexpr int kDefaultSparseCoresPerReplica = 4;

// Unchecked: only for values already bounded by validation (see checked_math.h for the checked
// form, CheckedRoundUp, which every size computed from attributes goes through first).
inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }
// log2 of a power of two (0 for anything <= 1); never loops, never shifts out of range.
inline int Log2(int64_t power_of_two) {
  return power_of_two <= 1 ? 0 : 63 - __builtin_clzll(static_cast<uint64_t>(power_of_two));
}

}  // namespace sce

#endif  // SCE_CORE_CONSTANTS_H_
