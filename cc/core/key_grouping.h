// The first step of an open vocabulary's key exchange over several replicas
// (docs/dynamic_vocabulary.md#several-replicas, tf_sc_embedding/exchanges/key_exchange.py): one
// replica's keys of one table -> its distinct keys grouped by the shard that owns them
// (KeyOwnerShard), each with its number of occurrences, and each occurrence's index among them.
//
// The order is part of the exchange's semantics: the owner's map steps through the keys it
// receives in this order, so it decides which key is admitted first. Distinct keys come in order
// of first appearance, grouped by owner stably (owner 0's first). TensorFlow spells this
// tf.unique, a segment sum, a stable argsort (a top-k), a bincount, an inverse permutation and
// two gathers; here it is one hash pass and one counting pass, O(n).
#ifndef SCE_CORE_KEY_GROUPING_H_
#define SCE_CORE_KEY_GROUPING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

struct KeysByOwner {
  std::vector<uint64_t> keys;          // the distinct keys, grouped by owner
  std::vector<int32_t> occurrences;    // per distinct key: its occurrences in the batch, >= 1
  std::vector<int32_t> owner_counts;   // per owner shard [num_shards]: its distinct keys
};

// Groups keys[0, n) for num_shards owner shards (num_shards in [1, kMaxReplicas]);
// positions[i] becomes the index of keys[i] in out->keys. n must fit in int32. `where` names
// the table in errors; on error nothing is written to positions.
Status GroupKeysByOwner(const std::string& where, const uint64_t* keys, int64_t n,
                        int64_t num_shards, int32_t* positions, KeysByOwner* out);

// The other end of the exchange: the owner's map steps through every occurrence of the keys it
// received, each key k of m repeated counts[k] times in order. indices receives, per occurrence,
// the index of its key (counts of 0 are skipped): O(sum of counts), where TensorFlow's tf.repeat
// builds an m x max(counts) mask. Counts must be >= 0 and sum to at most kMaxInt32; on error
// nothing is written.
Status RepeatIndices(const std::string& where, const int32_t* counts, int64_t m,
                     std::vector<int32_t>* indices);

}  // namespace sce

#endif  // SCE_CORE_KEY_GROUPING_H_
