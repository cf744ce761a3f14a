// libFuzzer target: sce::GroupKeysByOwner and sce::RepeatIndices (cc/core/key_grouping.h) with
// arbitrary shard counts and keys (many repeats, some arbitrary 64-bit values). Whatever is
// accepted must give every distinct key once, grouped by KeyOwnerShard in order of first
// appearance, with its occurrences, and each key's position must point at it; repeating the
// grouped keys by their occurrences (or by arbitrary counts) must give each index its count, in
// order; what is rejected must write nothing.
#include <cstdint>
#include <map>
#include <vector>

#include "cc/core/key_grouping.h"
#include "cc/core/key_row_map.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t shards =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 6) : sce_fuzz::Attr(in, 6);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 400);
  std::vector<uint64_t> keys;
  while (keys.size() < n && in.remaining_bytes() > 0) {
    keys.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 20)
                                    : in.ConsumeIntegral<uint64_t>());
  }
  const int64_t count = static_cast<int64_t>(keys.size());
  std::vector<int32_t> positions(keys.size(), -7);
  sce::KeysByOwner grouped;
  const sce::Status status =
      sce::GroupKeysByOwner("table 'f'", keys.data(), count, shards, positions.data(), &grouped);
  if (!status.ok()) {
    if (shards >= 1 && shards <= sce::kMaxReplicas) std::abort();   // valid arguments
    for (int32_t p : positions) {
      if (p != -7) std::abort();
    }
    return 0;
  }
  std::map<uint64_t, int32_t> occurrences;
  std::vector<uint64_t> unique;
  for (uint64_t k : keys) {
    if (occurrences[k]++ == 0) unique.push_back(k);
  }
  std::vector<uint64_t> want;
  std::vector<int32_t> want_counts(static_cast<size_t>(shards), 0);
  for (int64_t s = 0; s < shards; ++s) {
    for (uint64_t k : unique) {
      if (sce::KeyOwnerShard(k, static_cast<int32_t>(shards)) == s) {
        want.push_back(k);
        ++want_counts[s];
      }
    }
  }
  if (grouped.keys != want || grouped.owner_counts != want_counts ||
      grouped.occurrences.size() != want.size()) {
    std::abort();
  }
  for (size_t k = 0; k < want.size(); ++k) {
    if (grouped.occurrences[k] != occurrences[want[k]]) std::abort();
  }
  for (int64_t i = 0; i < count; ++i) {
    if (positions[i] < 0 || positions[i] >= static_cast<int32_t>(want.size()) ||
        want[positions[i]] != keys[i]) {
      std::abort();
    }
  }
  // The owner's expansion: the grouped occurrences, or arbitrary counts (negative ones too).
  std::vector<int32_t> counts = grouped.occurrences;
  if (in.ConsumeBool()) {
    counts.clear();
    while (counts.size() < 50 && in.remaining_bytes() > 0) {
      counts.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 5)
                                        : in.ConsumeIntegral<int32_t>());
    }
  }
  int64_t total = 0;
  bool valid = true;
  for (int32_t c : counts) {
    valid = valid && c >= 0;
    total += c;
  }
  valid = valid && total <= 2147483647;
  if (valid && total > (int64_t{1} << 22)) return 0;   // valid, but gigabytes to write
  std::vector<int32_t> repeats = {-7};
  const sce::Status repeated = sce::RepeatIndices("table 'f'", counts.data(),
                                                  static_cast<int64_t>(counts.size()), &repeats);
  if (!repeated.ok()) {
    if (valid || repeats != std::vector<int32_t>{-7}) std::abort();
    return 0;
  }
  if (!valid || static_cast<int64_t>(repeats.size()) != total) std::abort();
  size_t at = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    for (int32_t r = 0; r < counts[k]; ++r) {
      if (repeats[at++] != static_cast<int32_t>(k)) std::abort();
    }
  }
  return 0;
}
