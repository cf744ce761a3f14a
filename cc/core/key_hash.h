// The 64-bit mixing shared by the open-vocabulary code: the key map's slot and owner hashes
// (key_row_map.cc) and the numbers new rows' initial values are drawn from (key_values.cc).
#ifndef SCE_CC_CORE_KEY_HASH_H_
#define SCE_CC_CORE_KEY_HASH_H_

#include <cstdint>

namespace sce {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The high word of a * b: maps a uniform 64-bit hash onto [0, b) without a division.
inline uint64_t MultiplyHigh(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

}  // namespace sce

#endif  // SCE_CC_CORE_KEY_HASH_H_
