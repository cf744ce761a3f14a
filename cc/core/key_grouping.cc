#include "cc/core/key_grouping.h"

#include <algorithm>
#include <new>

#include "cc/core/checked_math.h"
#include "cc/core/key_hash.h"
#include "cc/core/key_row_map.h"

namespace sce {

Status GroupKeysByOwner(const std::string& where, const uint64_t* keys, int64_t n,
                        int64_t num_shards, int32_t* positions, KeysByOwner* out) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_shards", num_shards, 1, kMaxReplicas));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of keys", n, 0, kMaxInt32));
  if (out == nullptr || (n > 0 && (keys == nullptr || positions == nullptr))) {
    return InvalidArgument(where, ": bad key grouping arguments (", n, " keys)");
  }
  out->keys.clear();
  out->occurrences.clear();
  out->owner_counts.assign(static_cast<size_t>(num_shards), 0);
  if (n == 0) return Status::Ok();
  // Open addressing over at least twice as many slots as keys: each slot holds the index of a
  // distinct key (in order of first appearance), -1 when empty.
  int64_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  // first: each occurrence's distinct key (by appearance); owner, place: per distinct key, its
  // owner shard and its index in the grouped order.
  std::vector<int32_t> table, first, counts, owner, place;
  std::vector<uint64_t> distinct;
  try {
    table.assign(static_cast<size_t>(slots), -1);
    first.resize(static_cast<size_t>(n));
    distinct.reserve(static_cast<size_t>(n));
    counts.reserve(static_cast<size_t>(n));
    owner.reserve(static_cast<size_t>(n));
    place.reserve(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where, ": cannot allocate the grouping of ", n, " keys");
  }
  const uint64_t mask = static_cast<uint64_t>(slots - 1);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = keys[i];
    uint64_t slot = Mix64(key) & mask;
    while (true) {
      const int32_t at = table[slot];
      if (at < 0) {
        table[slot] = static_cast<int32_t>(distinct.size());
        first[i] = static_cast<int32_t>(distinct.size());
        distinct.push_back(key);
        counts.push_back(1);
        break;
      }
      if (distinct[at] == key) {
        first[i] = at;
        ++counts[at];
        break;
      }
      slot = (slot + 1) & mask;
    }
  }
  // A counting sort by owner, stable: each distinct key's place in the grouped order.
  const int64_t u = static_cast<int64_t>(distinct.size());
  owner.resize(static_cast<size_t>(u));
  place.resize(static_cast<size_t>(u));
  for (int64_t k = 0; k < u; ++k) {
    owner[k] = KeyOwnerShard(distinct[k], static_cast<int32_t>(num_shards));
    ++out->owner_counts[owner[k]];
  }
  std::vector<int64_t> next(static_cast<size_t>(num_shards), 0);
  for (int64_t s = 1; s < num_shards; ++s) next[s] = next[s - 1] + out->owner_counts[s - 1];
  out->keys.resize(static_cast<size_t>(u));
  out->occurrences.resize(static_cast<size_t>(u));
  for (int64_t k = 0; k < u; ++k) {
    const int64_t at = next[owner[k]]++;
    place[k] = static_cast<int32_t>(at);
    out->keys[at] = distinct[k];
    out->occurrences[at] = counts[k];
  }
  for (int64_t i = 0; i < n; ++i) positions[i] = place[first[i]];
  return Status::Ok();
}

Status RepeatIndices(const std::string& where, const int32_t* counts, int64_t m,
                     std::vector<int32_t>* indices) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of keys", m, 0, kMaxInt32));
  if (indices == nullptr || (m > 0 && counts == nullptr)) {
    return InvalidArgument(where, ": bad repeat arguments (", m, " keys)");
  }
  int64_t total = 0;
  for (int64_t k = 0; k < m; ++k) {
    if (counts[k] < 0) {
      return InvalidArgument(where, ": counts[", k, "] = ", counts[k], " is negative");
    }
    total += counts[k];
    if (total > kMaxInt32) {
      return InvalidArgument(where, ": the counts sum to more than ", kMaxInt32);
    }
  }
  try {
    indices->resize(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where, ": cannot allocate ", total, " repeats");
  }
  int32_t* out = indices->data();
  for (int64_t k = 0; k < m; ++k) {
    out = std::fill_n(out, counts[k], static_cast<int32_t>(k));
  }
  return Status::Ok();
}

}  // namespace sce
