#include "cc/core/radix_sort.h"

#include <algorithm>
#include <numeric>

namespace sce {

void StableSortByKey(const int32_t* keys, int64_t n, std::vector<uint32_t>* order,
                     std::vector<uint64_t>* scratch) {
  constexpr int kMaxBits = 11;
  order->resize(n);
  std::iota(order->begin(), order->end(), 0u);
  if (n < 2) return;
  // Branch-free, so it vectorizes: the largest key and whether any key is below its predecessor.
  int32_t max_key = keys[0];
  uint32_t descents = 0;
  for (int64_t i = 1; i < n; ++i) {
    max_key = std::max(max_key, keys[i]);
    descents |= static_cast<uint32_t>(keys[i] < keys[i - 1]);
  }
  if (descents == 0) return;
  if (n < 64) {
    std::stable_sort(order->begin(), order->end(),
                     [keys](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    return;
  }
  // Each element travels as one word, key above position, so every pass reads its input in
  // order (no gather through the order array). The passes split the key's significant bits
  // evenly into digits of at most kMaxBits, and all their histograms come from one read.
  int bits = 0;
  while (bits < 31 && (static_cast<uint32_t>(max_key) >> bits) != 0) ++bits;
  const int passes = (bits + kMaxBits - 1) / kMaxBits;
  const int digit = (bits + passes - 1) / passes;
  const uint64_t digit_mask = (uint64_t{1} << digit) - 1;
  scratch->resize(2 * static_cast<size_t>(n));
  uint64_t* from = scratch->data();
  uint64_t* to = from + n;
  // At most 3 passes (31 bits); 24 KiB on the stack, so a call allocates nothing but scratch.
  uint32_t counts[3 << kMaxBits];
  std::fill(counts, counts + (static_cast<size_t>(passes) << digit), 0u);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t word = (static_cast<uint64_t>(static_cast<uint32_t>(keys[i])) << 32) |
                          static_cast<uint32_t>(i);
    from[i] = word;
    for (int pass = 0; pass < passes; ++pass) {
      ++counts[(static_cast<size_t>(pass) << digit) + ((word >> (32 + pass * digit)) & digit_mask)];
    }
  }
  for (int pass = 0; pass < passes; ++pass) {
    uint32_t* c = counts + (static_cast<size_t>(pass) << digit);
    uint32_t total = 0;
    for (uint64_t b = 0; b <= digit_mask; ++b) {
      const uint32_t count = c[b];
      c[b] = total;
      total += count;
    }
    const int shift = 32 + pass * digit;
    for (int64_t i = 0; i < n; ++i) to[c[(from[i] >> shift) & digit_mask]++] = from[i];
    std::swap(from, to);
  }
  for (int64_t i = 0; i < n; ++i) (*order)[i] = static_cast<uint32_t>(from[i]);
}

}  // namespace sce
