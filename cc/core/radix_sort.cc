#include "cc/core/radix_sort.h"

#include <algorithm>
#include <numeric>

namespace sce {

namespace {

// One read of the words: the histogram of every pass's digit (pass p's at counts + (p << digit))
// and whether any key is smaller than the one before it (checked without a branch). kPasses is
// the pass count when it is a compile-time constant, 0 when `passes` gives it.
template <int kPasses>
uint64_t CountDigits(const uint64_t* words, int64_t n, int shift, uint64_t key_mask, int digit,
                     uint32_t* counts, int passes = kPasses) {
  const int count = kPasses > 0 ? kPasses : passes;
  const uint64_t digit_mask = (uint64_t{1} << digit) - 1;
  uint64_t descents = 0, previous = (words[0] >> shift) & key_mask;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = (words[i] >> shift) & key_mask;
    descents |= static_cast<uint64_t>(key < previous);
    previous = key;
    for (int pass = 0; pass < count; ++pass) {
      ++counts[(static_cast<size_t>(pass) << digit) + ((key >> (pass * digit)) & digit_mask)];
    }
  }
  return descents;
}

}  // namespace

const uint64_t* StableSortWords(uint64_t* words, uint64_t* buffer, int64_t n, int shift,
                                int bits) {
  // 12-bit digits: a 24-bit key (a stacked table of ~16M rows) takes two passes; the 4096
  // counters of a pass (16 KiB) stay in the L1 cache.
  constexpr int kMaxBits = 12;
  if (n < 2 || bits <= 0) return words;
  const uint64_t key_mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  auto key_of = [shift, key_mask](uint64_t word) { return (word >> shift) & key_mask; };
  if (n < 64) {
    std::stable_sort(words, words + n,
                     [&](uint64_t a, uint64_t b) { return key_of(a) < key_of(b); });
    return words;
  }
  // The passes split the key's bits evenly into digits of at most kMaxBits, and all their
  // histograms come from one read, which also finds whether the words are sorted already.
  const int passes = (bits + kMaxBits - 1) / kMaxBits;
  const int digit = (bits + passes - 1) / passes;
  const uint64_t digit_mask = (uint64_t{1} << digit) - 1;
  // At most 6 passes (64 bits); 96 KiB on the stack, so a call allocates nothing.
  uint32_t counts[6 << kMaxBits];
  std::fill(counts, counts + (static_cast<size_t>(passes) << digit), 0u);
  uint64_t descents = 0;
  switch (passes) {  // the pass count as a constant, so the counting loop is unrolled
    case 1: descents = CountDigits<1>(words, n, shift, key_mask, digit, counts); break;
    case 2: descents = CountDigits<2>(words, n, shift, key_mask, digit, counts); break;
    case 3: descents = CountDigits<3>(words, n, shift, key_mask, digit, counts); break;
    default: descents = CountDigits<0>(words, n, shift, key_mask, digit, counts, passes);
  }
  if (descents == 0) return words;
  uint64_t* from = words;
  uint64_t* to = buffer;
  for (int pass = 0; pass < passes; ++pass) {
    uint32_t* c = counts + (static_cast<size_t>(pass) << digit);
    uint32_t total = 0;
    for (uint64_t b = 0; b <= digit_mask; ++b) {
      const uint32_t count = c[b];
      c[b] = total;
      total += count;
    }
    const int digit_shift = shift + pass * digit;
    // The last digit may reach past the key (passes * digit >= bits): it keeps only the key's
    // bits, as the counting read did, whatever the word holds above them.
    const int pass_bits = std::min(digit, bits - pass * digit);  // <= kMaxBits
    const uint64_t pass_mask = (uint64_t{1} << pass_bits) - 1;
    for (int64_t i = 0; i < n; ++i) to[c[(from[i] >> digit_shift) & pass_mask]++] = from[i];
    std::swap(from, to);
  }
  return from;
}

void StableSortByKey(const int32_t* keys, int64_t n, std::vector<uint32_t>* order,
                     std::vector<uint64_t>* scratch) {
  order->resize(n);
  if (n < 2) {
    std::iota(order->begin(), order->end(), 0u);
    return;
  }
  // Each element travels as one word, key above position, so every pass reads its input in
  // order (no gather through the order array).
  scratch->resize(2 * static_cast<size_t>(n));
  uint64_t* words = scratch->data();
  int32_t max_key = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_key = std::max(max_key, keys[i]);
    words[i] = (static_cast<uint64_t>(static_cast<uint32_t>(keys[i])) << 32) |
               static_cast<uint32_t>(i);
  }
  int bits = 0;
  while (bits < 31 && (static_cast<uint32_t>(max_key) >> bits) != 0) ++bits;
  const uint64_t* sorted = StableSortWords(words, words + n, n, 32, bits);
  for (int64_t i = 0; i < n; ++i) (*order)[i] = static_cast<uint32_t>(sorted[i]);
}

}  // namespace sce
