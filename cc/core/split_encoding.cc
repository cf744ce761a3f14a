#include "cc/core/split_encoding.h"

#include <algorithm>

namespace sce {

std::vector<int32_t> BinaryToBucketSplits(int64_t bits, int max_division_level) {
  std::vector<int32_t> points;
  if (max_division_level < 1 || max_division_level > kMaxSplitLevel) return points;
  const int64_t num_bits = (int64_t{1} << max_division_level) - 1;
  for (int64_t k = 0; k < num_bits && k < 63; ++k) {
    if (((bits >> k) & 1) == 0) continue;
    int level = 0;
    while ((int64_t{2} << level) - 1 <= k) ++level;  // level = floor(log2(k + 1))
    const int64_t offset = k - ((int64_t{1} << level) - 1);
    points.push_back(
        static_cast<int32_t>((int64_t{1} << (max_division_level - 1 - level)) * (2 * offset + 1)));
  }
  std::sort(points.begin(), points.end());
  return points;
}

int64_t BucketSplitsToBinary(const std::vector<int32_t>& splits, int max_division_level) {
  int64_t bits = 0;
  if (max_division_level < 1 || max_division_level > kMaxSplitLevel) return bits;
  for (int32_t point : splits) {
    // Only points strictly inside (0, 2^L) have a bit; anything else would shift out of range.
    if (point <= 0 || point >= (int32_t{1} << max_division_level)) continue;
    int64_t x = point;
    int level = max_division_level - 1;
    while (x > 0 && x % 2 == 0) {
      x /= 2;
      --level;
    }
    bits |= int64_t{1} << (((int64_t{1} << level) - 1) + x / 2);
  }
  return bits;
}

}  // namespace sce
