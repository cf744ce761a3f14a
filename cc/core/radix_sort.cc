#include "cc/core/radix_sort.h"

#include <algorithm>
#include <numeric>

namespace sce {

void StableSortByKey(const int32_t* keys, int64_t n, std::vector<uint32_t>* order,
                     std::vector<uint32_t>* scratch) {
  constexpr int kBits = 11;
  constexpr uint32_t kBuckets = 1u << kBits;
  order->resize(n);
  std::iota(order->begin(), order->end(), 0u);
  if (n < 2) return;
  int32_t max_key = 0;
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    max_key = std::max(max_key, keys[i]);
    if (i > 0 && keys[i] < keys[i - 1]) sorted = false;
  }
  if (sorted) return;
  if (n < 64) {
    std::stable_sort(order->begin(), order->end(),
                     [keys](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    return;
  }
  scratch->resize(n);
  uint32_t counts[kBuckets];
  for (int shift = 0; shift < 31 && (static_cast<uint32_t>(max_key) >> shift) != 0; shift += kBits) {
    std::fill(counts, counts + kBuckets, 0u);
    for (int64_t i = 0; i < n; ++i) ++counts[(static_cast<uint32_t>(keys[(*order)[i]]) >> shift) & (kBuckets - 1)];
    uint32_t total = 0;
    for (uint32_t b = 0; b < kBuckets; ++b) {
      const uint32_t c = counts[b];
      counts[b] = total;
      total += c;
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t position = (*order)[i];
      (*scratch)[counts[(static_cast<uint32_t>(keys[position]) >> shift) & (kBuckets - 1)]++] = position;
    }
    order->swap(*scratch);
  }
}

}  // namespace sce
