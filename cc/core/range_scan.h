// Scans that find the first invalid entry of an id array: an index outside [0, limit), or a
// value below its predecessor.
//
// Every kernel validates the ids it reads before it writes anything, so these scans run over
// every id of every step, often several times (the routing op, both segment sums and the owner's
// CSR each check theirs). A loop that returns at the first bad entry has a branch per entry and
// cannot be vectorized; these test a block of entries without a branch (one OR-reduction the
// compiler vectorizes) and search a block again, entry by entry, only when it holds a bad entry.
// They return the same index as the simple loop.
#ifndef SCE_CORE_RANGE_SCAN_H_
#define SCE_CORE_RANGE_SCAN_H_

#include <algorithm>
#include <cstdint>

namespace sce {

// Entries tested per block before the block's result is looked at.
inline constexpr int64_t kRangeScanBlock = 1024;

// Index of the first of values[0, n) outside [0, limit), or -1. A limit above 2^31 is taken as
// 2^31 (no int32 reaches it).
inline int64_t FirstOutOfRange(const int32_t* values, int64_t n, int64_t limit) {
  if (n <= 0) return -1;
  if (limit <= 0) return 0;
  // As unsigned, a negative value is at least 2^31 >= the clamped limit: one compare per entry.
  const uint32_t bound = static_cast<uint32_t>(std::min<int64_t>(limit, int64_t{1} << 31));
  for (int64_t base = 0; base < n; base += kRangeScanBlock) {
    const int64_t end = std::min(n, base + kRangeScanBlock);
    uint32_t bad = 0;
    for (int64_t i = base; i < end; ++i) bad |= static_cast<uint32_t>(values[i]) >= bound;
    if (bad == 0) continue;
    for (int64_t i = base; i < end; ++i) {
      if (static_cast<uint32_t>(values[i]) >= bound) return i;
    }
  }
  return -1;
}

// Index of the first i in [1, n) with values[i] < values[i - 1], or -1.
inline int64_t FirstDecrease(const int32_t* values, int64_t n) {
  for (int64_t base = 1; base < n; base += kRangeScanBlock) {
    const int64_t end = std::min(n, base + kRangeScanBlock);
    uint32_t bad = 0;
    for (int64_t i = base; i < end; ++i) bad |= values[i] < values[i - 1];
    if (bad == 0) continue;
    for (int64_t i = base; i < end; ++i) {
      if (values[i] < values[i - 1]) return i;
    }
  }
  return -1;
}

// Index of the first of values[0, n) outside [0, limit) or below its predecessor (the one before
// values[0] taken as `previous`), or -1: the check of sorted sample rows. One pass, as
// FirstOutOfRange.
inline int64_t FirstUnsortedOrOutOfRange(const int32_t* values, int64_t n, int64_t limit,
                                         int32_t previous = 0) {
  if (n <= 0) return -1;
  if (limit <= 0) return 0;
  const uint32_t bound = static_cast<uint32_t>(std::min<int64_t>(limit, int64_t{1} << 31));
  const auto bad_at = [&](int64_t i, int32_t before) {
    return static_cast<uint32_t>(values[i]) >= bound || values[i] < before;
  };
  if (bad_at(0, previous)) return 0;
  for (int64_t base = 1; base < n; base += kRangeScanBlock) {
    const int64_t end = std::min(n, base + kRangeScanBlock);
    uint32_t bad = 0;
    for (int64_t i = base; i < end; ++i) {
      bad |= (static_cast<uint32_t>(values[i]) >= bound) | (values[i] < values[i - 1]);
    }
    if (bad == 0) continue;
    for (int64_t i = base; i < end; ++i) {
      if (bad_at(i, values[i - 1])) return i;
    }
  }
  return -1;
}

}  // namespace sce

#endif  // SCE_CORE_RANGE_SCAN_H_
