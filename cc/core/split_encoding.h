// The minibatch split bitmask (docs/preprocessing.md#split-encoding): a heap-ordered binary tree over 2^L vocabulary
// divisions in which bit k means "split section k at its midpoint".
#ifndef SCE_CORE_SPLIT_ENCODING_H_
#define SCE_CORE_SPLIT_ENCODING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

// The encoding has 2^L - 1 bits in an int64, so L is at most 6; levels outside [1, 6] have no
// split points (both functions then return empty / 0).
constexpr int kMaxSplitLevel = 6;

// The max_division_level attribute of the minibatching ops must be in [0, kMaxSplitLevel].
// `where` prefixes the error, e.g. "table 'video'".
inline Status CheckDivisionLevel(const std::string& where, int64_t level) {
  if (level < 0 || level > kMaxSplitLevel) {
    return InvalidArgument(where, ": max_division_level must be in [0, ",
                           kMaxSplitLevel, "], got ", level);
  }
  return Status::Ok();
}

// Sorted division indices (in (0, 2^L)) at which the vocabulary is cut.
std::vector<int32_t> BinaryToBucketSplits(int64_t bits, int max_division_level);

// Inverse of BinaryToBucketSplits for any set of points in (0, 2^L); other points are ignored.
int64_t BucketSplitsToBinary(const std::vector<int32_t>& splits, int max_division_level);

}  // namespace sce

#endif  // SCE_CORE_SPLIT_ENCODING_H_
