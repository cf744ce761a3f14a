// libFuzzer target: sce::StringKeyRowMap (docs/dynamic_vocabulary.md#string-keys). Strings from
// a small fuzzed set get fingerprints from a tiny fuzzed range, so fingerprints collide often.
// Checked against the int64 reference model run on the fingerprints, plus the string rule: a
// fingerprint's row belongs to one string (the first to read it when it is given out), others
// are answered kNoRow and counted; rows are never shared by two strings; Export lists exactly
// the owning strings; a saved state imported into a fresh map continues exactly the same way.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/string_key_row_map.h"
#include "cc/tests/key_row_map_reference.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  sce::KeyRowMapConfig config;
  config.capacity = in.ConsumeIntegralInRange<int64_t>(1, 24);
  config.admission_threshold = in.ConsumeIntegralInRange<int64_t>(1, 3);
  config.steps_to_live = in.ConsumeIntegralInRange<int64_t>(0, 3);
  config.pending_capacity = in.ConsumeIntegralInRange<int64_t>(1, 24);
  std::unique_ptr<sce::StringKeyRowMap> map;
  SCE_FUZZ_CHECK(sce::StringKeyRowMap::Create("t", config, &map).ok());
  sce_testing::ReferenceKeyRowMap reference(config);
  // The strings and their fingerprints (a fixed function of the string within one input).
  std::vector<std::string> strings(in.ConsumeIntegralInRange<size_t>(1, 12));
  std::map<std::string, uint64_t> fingerprint_of;
  const uint64_t range = in.ConsumeIntegralInRange<uint64_t>(1, 16);
  for (std::string& s : strings) {
    s = in.ConsumeRandomLengthString(6);
    if (!fingerprint_of.count(s)) {
      fingerprint_of[s] = in.ConsumeIntegralInRange<uint64_t>(0, range) * 0x9e3779b97f4a7c15ULL;
    }
  }
  std::map<uint64_t, std::string> owner;  // fingerprint -> string holding its row
  int64_t step = 0;
  const int steps = in.ConsumeIntegralInRange<int>(1, 16);
  for (int s = 0; s < steps && in.remaining_bytes() > 0; ++s) {
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {  // save and restore
      const sce::StringKeyRowMapState saved = map->Export();
      std::unique_ptr<sce::StringKeyRowMap> restored;
      SCE_FUZZ_CHECK(sce::StringKeyRowMap::Create("t", config, &restored).ok());
      SCE_FUZZ_CHECK(restored->Import(saved).ok());
      const sce::StringKeyRowMapState again = restored->Export();
      SCE_FUZZ_CHECK(again.keys == saved.keys && again.last_seen == saved.last_seen &&
                     again.fingerprints == saved.fingerprints &&
                     again.pending_fingerprints == saved.pending_fingerprints &&
                     again.pending_counts == saved.pending_counts);
      map = std::move(restored);
    }
    step += in.ConsumeIntegralInRange<int64_t>(0, 2);
    std::vector<std::string> keys(in.ConsumeIntegralInRange<size_t>(0, 24));
    for (std::string& k : keys) k = strings[in.ConsumeIntegralInRange<size_t>(0, strings.size() - 1)];
    std::vector<std::string_view> views(keys.begin(), keys.end());
    std::vector<uint64_t> fingerprints;
    for (const std::string& k : keys) fingerprints.push_back(fingerprint_of[k]);
    std::vector<int32_t> rows(keys.size(), 777), new_rows;
    sce::KeyRowMapStepStats stats, expected_stats;
    int64_t collided = -1;
    SCE_FUZZ_CHECK(map->MapStep(step, views.data(), fingerprints.data(),
                                static_cast<int64_t>(keys.size()), rows.data(), &new_rows,
                                &stats, &collided)
                       .ok());
    std::vector<uint64_t> admitted;
    const std::vector<bool> has_row =
        reference.MapStep(step, fingerprints, &admitted, &expected_stats);
    SCE_FUZZ_CHECK(new_rows.size() == admitted.size());
    // Owners: a fingerprint admitted in this step belongs to its first string in batch order.
    std::map<uint64_t, bool> is_new;
    for (uint64_t f : admitted) is_new[f] = true;
    int64_t expected_collided = 0;
    std::map<int32_t, std::string> row_string;
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t f = fingerprints[i];
      if (!has_row[i]) {
        SCE_FUZZ_CHECK(rows[i] == sce::kNoRow);
        continue;
      }
      if (is_new[f]) {
        owner[f] = keys[i];
        is_new[f] = false;
      }
      if (owner[f] != keys[i]) {
        SCE_FUZZ_CHECK(rows[i] == sce::kNoRow);
        ++expected_collided;
        continue;
      }
      SCE_FUZZ_CHECK(rows[i] >= 0 && rows[i] < config.capacity);
      auto [it, inserted] = row_string.emplace(rows[i], keys[i]);
      SCE_FUZZ_CHECK(it->second == keys[i]);  // never shared by two strings
    }
    SCE_FUZZ_CHECK(collided == expected_collided);
    SCE_FUZZ_CHECK(stats.unadmitted_ids == expected_stats.unadmitted_ids + expected_collided);
    SCE_FUZZ_CHECK(stats.admitted_keys == expected_stats.admitted_keys);
    const sce::StringKeyRowMapState state = map->Export();
    const sce::KeyRowMapState expected = reference.Export();
    SCE_FUZZ_CHECK(state.keys.size() == expected.keys.size());
    std::map<uint64_t, std::string> exported;
    for (size_t k = 0; k < state.keys.size(); ++k) {
      exported[state.fingerprints[k]] = state.keys[k];
      SCE_FUZZ_CHECK(fingerprint_of[state.keys[k]] == state.fingerprints[k]);
      SCE_FUZZ_CHECK(k == 0 || state.keys[k - 1] < state.keys[k]);
    }
    for (size_t k = 0; k < expected.keys.size(); ++k) {
      SCE_FUZZ_CHECK(exported.count(expected.keys[k]) &&
                     exported[expected.keys[k]] == owner[expected.keys[k]]);
    }
    SCE_FUZZ_CHECK(state.pending_fingerprints == expected.pending_keys);
    SCE_FUZZ_CHECK(state.pending_counts == expected.pending_counts);
  }
  return 0;
}
