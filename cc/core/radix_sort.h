// Stable sort of positions by a non-negative int32 key (LSD radix sort on (key, position) words,
// digits of at most 12 bits). The hot
// preprocessing paths sort a few thousand ids per SparseCore, where this is several times faster
// than a comparison sort, and stability keeps equal ids in input order as the spec requires.
#ifndef SCE_CORE_RADIX_SORT_H_
#define SCE_CORE_RADIX_SORT_H_

#include <cstdint>
#include <vector>

namespace sce {

// Sorts words[0, n) stably by their bits [shift, shift + bits) (a key packed into the word
// together with what travels with it); `buffer` holds n words of scratch. Returns where the
// sorted words are: `words` or `buffer`.
const uint64_t* StableSortWords(uint64_t* words, uint64_t* buffer, int64_t n, int shift,
                                int bits);

// Fills `order` with 0..n-1 sorted stably by keys[i]; every key must be >= 0.
// `scratch` is reused between calls to avoid allocations.
void StableSortByKey(const int32_t* keys, int64_t n, std::vector<uint32_t>* order,
                     std::vector<uint64_t>* scratch);

}  // namespace sce

#endif  // SCE_CORE_RADIX_SORT_H_
