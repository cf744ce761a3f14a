// libFuzzer target: sce::KeyRowMap (docs/dynamic_vocabulary.md), the key-to-row map of an open
// vocabulary. Arbitrary configurations (invalid ones must fail at Create) and sequences of steps
// whose keys come from a small set (so they repeat, reach thresholds and expire) or are arbitrary
// 64-bit values. Every step is compared with the reference model of cc/tests/; rows must be in
// range, one per key in a step, kept while the key holds its row, and never shared. Steps that go
// back and corrupted saved states must fail and change nothing; a saved state imported into a
// fresh map must continue exactly like the original.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cc/core/key_row_map.h"
#include "cc/tests/key_row_map_reference.h"
#include "fuzz/fuzz_common.h"

namespace {

bool SameLogicalState(const sce::KeyRowMapState& a, const sce::KeyRowMapState& b) {
  return a.last_step == b.last_step && a.keys == b.keys && a.last_seen == b.last_seen &&
         a.pending_keys == b.pending_keys && a.pending_counts == b.pending_counts &&
         a.pending_last_seen == b.pending_last_seen;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  sce::KeyRowMapConfig config;
  const bool wild = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  config.capacity = wild ? sce_fuzz::Attr(in) : in.ConsumeIntegralInRange<int64_t>(1, 48);
  config.admission_threshold = wild ? sce_fuzz::Attr(in) : in.ConsumeIntegralInRange<int64_t>(1, 4);
  config.steps_to_live = wild ? sce_fuzz::Attr(in) : in.ConsumeIntegralInRange<int64_t>(0, 5);
  config.pending_capacity = wild ? sce_fuzz::Attr(in) : in.ConsumeIntegralInRange<int64_t>(1, 40);
  const bool valid = config.capacity >= 1 && config.capacity <= (int64_t{1} << 12) &&
                     config.admission_threshold >= 1 &&
                     config.admission_threshold <= sce::kMaxInt32 && config.steps_to_live >= 0 &&
                     config.steps_to_live <= sce::kMaxKeyRowMapStep &&
                     config.pending_capacity >= 1 && config.pending_capacity <= (int64_t{1} << 12);
  // Valid but huge capacities are checked for their errors only (no allocation here).
  if (!valid) {
    const bool in_range = config.capacity >= 1 && config.capacity <= sce::kMaxKeyRowMapCapacity &&
                          config.admission_threshold >= 1 &&
                          config.admission_threshold <= sce::kMaxInt32 &&
                          config.steps_to_live >= 0 &&
                          config.steps_to_live <= sce::kMaxKeyRowMapStep &&
                          config.pending_capacity >= 1 &&
                          config.pending_capacity <= sce::kMaxKeyRowMapCapacity;
    SCE_FUZZ_CHECK(sce::ValidateKeyRowMapConfig("t", config).ok() == in_range);
    return 0;
  }
  std::unique_ptr<sce::KeyRowMap> map;
  SCE_FUZZ_CHECK(sce::KeyRowMap::Create("t", config, &map).ok());
  sce_testing::ReferenceKeyRowMap reference(config);
  std::vector<uint64_t> universe(in.ConsumeIntegralInRange<size_t>(1, 64));
  for (uint64_t& key : universe) key = in.ConsumeIntegral<uint64_t>();
  std::map<uint64_t, int32_t> held_rows;  // after the previous step
  std::vector<int32_t> expected_reset;    // rows admitted and not confirmed, once each
  std::map<int32_t, uint64_t> last_key_of_row;   // the key each row was last given to
  int64_t step = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(0, sce::kMaxInt32);
  const int steps = in.ConsumeIntegralInRange<int>(1, 24);
  for (int s = 0; s < steps && in.remaining_bytes() > 0; ++s) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0: {  // a step that goes back, or beyond the last storable step: nothing changes
        const sce::KeyRowMapState before = map->Export();
        const int64_t bad = in.ConsumeBool() ? step - in.ConsumeIntegralInRange<int64_t>(1, 9)
                                             : sce::kMaxKeyRowMapStep + 1;
        if (bad >= map->last_step() && bad <= sce::kMaxKeyRowMapStep) break;
        std::vector<uint64_t> keys = {universe[0]}, new_keys;
        std::vector<int32_t> rows(1), new_rows;
        sce::KeyRowMapStepStats stats;
        SCE_FUZZ_CHECK(!map->MapStep(bad, keys.data(), 1, rows.data(), &new_keys, &new_rows,
                                     &stats).ok());
        SCE_FUZZ_CHECK(SameLogicalState(before, map->Export()));
        continue;
      }
      case 1: {  // a corrupted saved state fails and changes nothing
        const sce::KeyRowMapState before = map->Export();
        sce::KeyRowMapState corrupt = before;
        switch (in.ConsumeIntegralInRange<int>(0, 3)) {
          case 0:
            corrupt.keys.resize(config.capacity + 1, 0);
            corrupt.last_seen.resize(config.capacity + 1, 0);
            break;
          case 1:  // a repeated key (or, with none held, a key seen before any step)
            corrupt.keys.push_back(corrupt.keys.empty() ? 0 : corrupt.keys.front());
            corrupt.last_seen.push_back(corrupt.keys.size() == 1 ? -1 : 0);
            break;
          case 2:
            corrupt.pending_keys.push_back(universe[0]);
            corrupt.pending_counts.push_back(in.ConsumeIntegralInRange<int32_t>(-2, 0));
            corrupt.pending_last_seen.push_back(0);
            break;
          default:
            corrupt.last_seen.push_back(0);
            break;
        }
        SCE_FUZZ_CHECK(!map->Import(corrupt).ok());
        SCE_FUZZ_CHECK(SameLogicalState(before, map->Export()));
        continue;
      }
      case 2: {  // save and restore into a fresh map: it continues exactly like the original
        const sce::KeyRowMapState saved = map->Export();
        std::unique_ptr<sce::KeyRowMap> restored;
        SCE_FUZZ_CHECK(sce::KeyRowMap::Create("t", config, &restored).ok());
        SCE_FUZZ_CHECK(restored->Import(saved).ok());
        const sce::KeyRowMapState again = restored->Export();
        SCE_FUZZ_CHECK(SameLogicalState(saved, again));
        for (size_t i = 0; i < again.rows.size(); ++i) {
          SCE_FUZZ_CHECK(again.rows[i] == static_cast<int32_t>(i));
        }
        map = std::move(restored);
        expected_reset.clear();   // an import resets nothing: its caller writes every row
        held_rows.clear();
        for (size_t i = 0; i < again.keys.size(); ++i) held_rows[again.keys[i]] = again.rows[i];
        continue;
      }
      default:
        break;
    }
    step = std::min<int64_t>(step + in.ConsumeIntegralInRange<int64_t>(0, 3),
                             sce::kMaxKeyRowMapStep);
    std::vector<uint64_t> keys(in.ConsumeIntegralInRange<size_t>(0, 40));
    for (uint64_t& key : keys) {
      key = in.ConsumeIntegralInRange<int>(0, 15) == 0
                ? in.ConsumeIntegral<uint64_t>()
                : universe[in.ConsumeIntegralInRange<size_t>(0, universe.size() - 1)];
    }
    std::vector<int32_t> rows(keys.size(), 12345);
    std::vector<uint64_t> new_keys, expected_new;
    std::vector<int32_t> new_rows;
    sce::KeyRowMapStepStats stats, expected_stats;
    SCE_FUZZ_CHECK(map->MapStep(step, keys.data(), static_cast<int64_t>(keys.size()),
                                rows.empty() ? nullptr : rows.data(), &new_keys, &new_rows,
                                &stats).ok());
    const std::vector<bool> has_row = reference.MapStep(step, keys, &expected_new, &expected_stats);
    SCE_FUZZ_CHECK(new_keys == expected_new);
    SCE_FUZZ_CHECK(new_rows.size() == new_keys.size());
    SCE_FUZZ_CHECK(stats.admitted_keys == expected_stats.admitted_keys);
    SCE_FUZZ_CHECK(stats.refused_keys == expected_stats.refused_keys);
    SCE_FUZZ_CHECK(stats.unadmitted_ids == expected_stats.unadmitted_ids);
    SCE_FUZZ_CHECK(stats.untracked_ids == expected_stats.untracked_ids);
    const std::set<uint64_t> admitted(new_keys.begin(), new_keys.end());
    std::map<uint64_t, int32_t> step_rows;
    for (size_t i = 0; i < keys.size(); ++i) {
      SCE_FUZZ_CHECK((rows[i] != sce::kNoRow) == has_row[i]);
      if (rows[i] == sce::kNoRow) continue;
      SCE_FUZZ_CHECK(rows[i] >= 0 && rows[i] < config.capacity);
      const auto [it, inserted] = step_rows.emplace(keys[i], rows[i]);
      SCE_FUZZ_CHECK(it->second == rows[i]);
      auto before = held_rows.find(keys[i]);
      if (!admitted.count(keys[i]) && before != held_rows.end()) {
        SCE_FUZZ_CHECK(before->second == rows[i]);
      }
    }
    for (size_t k = 0; k < new_keys.size(); ++k) {
      SCE_FUZZ_CHECK(step_rows.count(new_keys[k]) && step_rows[new_keys[k]] == new_rows[k]);
    }
    {   // Numbering the step's rows: first-occurrence order, kNoRow once, the map unchanged;
        // a row not given in this step (or out of range) fails and changes nothing.
      const sce::KeyRowMapState before = map->Export();
      std::vector<int32_t> numbered = rows;
      if (!numbered.empty() && in.ConsumeIntegralInRange<int>(0, 7) == 0) {
        numbered[in.ConsumeIntegralInRange<size_t>(0, numbered.size() - 1)] =
            in.ConsumeIntegralInRange<int32_t>(-3, static_cast<int32_t>(config.capacity) + 2);
      }
      // Given in the last step: held by a key last seen at that step (by this call, or by an
      // earlier call for the same step).
      std::set<int32_t> seen_now;
      for (size_t k = 0; k < before.rows.size(); ++k) {
        if (before.last_seen[k] == step) seen_now.insert(before.rows[k]);
      }
      bool given = true;
      for (int32_t row : numbered) given = given && (row == sce::kNoRow || seen_now.count(row));
      std::vector<int32_t> positions(numbered.size(), 12345), unique{7};
      const bool ok = map->NumberStepRows(numbered.empty() ? nullptr : numbered.data(),
                                          static_cast<int64_t>(numbered.size()),
                                          positions.empty() ? nullptr : positions.data(),
                                          &unique).ok();
      SCE_FUZZ_CHECK(SameLogicalState(before, map->Export()));
      SCE_FUZZ_CHECK(ok == given);
      if (ok) {
        std::vector<int32_t> expected_unique;
        for (size_t i = 0; i < numbered.size(); ++i) {
          auto at = std::find(expected_unique.begin(), expected_unique.end(), numbered[i]);
          if (at == expected_unique.end()) {
            expected_unique.push_back(numbered[i]);
            at = expected_unique.end() - 1;
          }
          SCE_FUZZ_CHECK(positions[i] == at - expected_unique.begin());
        }
        SCE_FUZZ_CHECK(unique == expected_unique);
      } else {
        SCE_FUZZ_CHECK(unique.empty());
      }
    }
    for (int32_t row : new_rows) {   // the rows to reset: every admission's row, listed once
      if (std::find(expected_reset.begin(), expected_reset.end(), row) == expected_reset.end()) {
        expected_reset.push_back(row);
      }
    }
    SCE_FUZZ_CHECK(map->rows_to_reset() == expected_reset);
    // Each listed row comes with the key it was last given to.
    for (size_t k = 0; k < new_rows.size(); ++k) last_key_of_row[new_rows[k]] = new_keys[k];
    SCE_FUZZ_CHECK(map->keys_to_reset().size() == expected_reset.size());
    for (size_t k = 0; k < expected_reset.size(); ++k) {
      SCE_FUZZ_CHECK(map->keys_to_reset()[k] == last_key_of_row[expected_reset[k]]);
    }
    if (in.ConsumeBool()) {   // the caller's writes ran: confirm a prefix
      const int64_t confirmed = in.ConsumeIntegralInRange<int64_t>(
          0, static_cast<int64_t>(expected_reset.size()));
      map->ConfirmReset(confirmed);
      expected_reset.erase(expected_reset.begin(), expected_reset.begin() + confirmed);
      SCE_FUZZ_CHECK(map->rows_to_reset() == expected_reset);
    }
    const sce::KeyRowMapState state = map->Export();
    {   // Find answers exactly the exported keys' rows, -1 for any other key
      std::map<uint64_t, int32_t> exported;
      for (size_t i = 0; i < state.keys.size(); ++i) exported[state.keys[i]] = state.rows[i];
      std::vector<int32_t> found(keys.size(), 12345);
      map->Find(keys.data(), static_cast<int64_t>(keys.size()),
                found.empty() ? nullptr : found.data());
      for (size_t i = 0; i < keys.size(); ++i) {
        auto it = exported.find(keys[i]);
        SCE_FUZZ_CHECK(found[i] == (it == exported.end() ? sce::kNoRow : it->second));
      }
    }
    const sce::KeyRowMapState expected = reference.Export();
    SCE_FUZZ_CHECK(state.keys == expected.keys);
    SCE_FUZZ_CHECK(state.last_seen == expected.last_seen);
    SCE_FUZZ_CHECK(state.pending_keys == expected.pending_keys);
    SCE_FUZZ_CHECK(state.pending_counts == expected.pending_counts);
    SCE_FUZZ_CHECK(state.pending_last_seen == expected.pending_last_seen);
    SCE_FUZZ_CHECK(state.rows.size() == state.keys.size());
    SCE_FUZZ_CHECK(std::set<int32_t>(state.rows.begin(), state.rows.end()).size() ==
                   state.rows.size());
    SCE_FUZZ_CHECK(map->size() <= config.capacity);
    SCE_FUZZ_CHECK(map->pending_size() <= config.pending_capacity);
    held_rows.clear();
    for (size_t k = 0; k < state.keys.size(); ++k) held_rows[state.keys[k]] = state.rows[k];
  }
  return 0;
}
