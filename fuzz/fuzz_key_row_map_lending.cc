// libFuzzer target: the key-to-row maps of one open-vocabulary table over several shards, lending
// each other rows (KeyRowMap::MapStep with wait, FreeRows, LendRows, FinishStep, Import with a
// placement; docs/dynamic_vocabulary.md#capacity-over-several-replicas). Random shard counts,
// capacities, thresholds and steps_to_live; steps whose keys go to their owner shard, then the
// lending plan of the exchange (lenders in shard order fill borrowers in shard order). After
// every step: rows are rows of the whole table, never shared by two keys, each occurrence reads
// its key's row; no row is lost or duplicated (over all maps, free rows plus held keys are the
// table's rows); a step refuses a key only when no row is free; and while nothing has been
// refused the held keys are those of one map of the whole capacity (the reference model).
// Lending more than is free, or finishing a step that did not wait, fails and changes nothing;
// the whole state exported and imported with its placement continues exactly.
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

using Maps = std::vector<std::unique_ptr<sce::KeyRowMap>>;

Maps NewMaps(const sce::KeyRowMapConfig& base, int64_t total, int64_t shards) {
  Maps maps(shards);
  int64_t first = 0;
  for (int64_t r = 0; r < shards; ++r) {
    sce::KeyRowMapConfig config = base;
    config.capacity = total / shards + (r < total % shards ? 1 : 0);
    config.total_rows = total;
    config.first_row = first;
    first += config.capacity;
    SCE_FUZZ_CHECK(sce::KeyRowMap::Create("t", config, &maps[r]).ok());
  }
  return maps;
}

// Every map's keys with their rows of the whole table.
std::map<uint64_t, int32_t> HeldRows(const Maps& maps) {
  std::map<uint64_t, int32_t> held;
  std::set<int32_t> rows;
  for (const auto& map : maps) {
    sce::KeyRowMapState state = map->Export();
    map->ToTableRows(state.rows.data(), static_cast<int64_t>(state.rows.size()));
    for (size_t i = 0; i < state.keys.size(); ++i) {
      SCE_FUZZ_CHECK(rows.insert(state.rows[i]).second);   // never shared
      SCE_FUZZ_CHECK(held.emplace(state.keys[i], state.rows[i]).second);
    }
  }
  return held;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t shards = in.ConsumeIntegralInRange<int64_t>(2, 4);
  const int64_t total = in.ConsumeIntegralInRange<int64_t>(shards, 40);
  sce::KeyRowMapConfig config;
  config.admission_threshold = in.ConsumeIntegralInRange<int64_t>(1, 3);
  config.steps_to_live = in.ConsumeIntegralInRange<int64_t>(0, 4);
  config.pending_capacity = 1000;   // the reference has one pending table for every shard
  Maps maps = NewMaps(config, total, shards);
  sce::KeyRowMapConfig single = config;
  single.capacity = total;
  sce_testing::ReferenceKeyRowMap reference(single);
  std::vector<uint64_t> universe(in.ConsumeIntegralInRange<size_t>(1, 64));
  for (uint64_t& key : universe) key = in.ConsumeIntegral<uint64_t>();
  bool refused_ever = false;
  int64_t step = 0;
  const int steps = in.ConsumeIntegralInRange<int>(1, 20);
  for (int s = 0; s < steps && in.remaining_bytes() > 0; ++s) {
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {   // save and restore with the placement
      std::vector<sce::KeyRowMapState> states;
      std::vector<sce::KeyRowMapPlacement> placements(shards);
      for (int64_t r = 0; r < shards; ++r) {
        states.push_back(maps[r]->Export());
        placements[r].rows = states[r].rows;
        maps[r]->ToTableRows(placements[r].rows.data(),
                             static_cast<int64_t>(placements[r].rows.size()));
      }
      for (int64_t r = 0; r < shards; ++r) {   // own rows held by another shard's key
        const int64_t first = maps[r]->config().first_row, own = maps[r]->config().capacity;
        for (int64_t q = 0; q < shards; ++q) {
          if (q == r) continue;
          for (int32_t row : placements[q].rows) {
            if (row >= first && row < first + own) placements[r].lent_rows.push_back(row);
          }
        }
      }
      const std::map<uint64_t, int32_t> before = HeldRows(maps);
      Maps restored = NewMaps(config, total, shards);
      for (int64_t r = 0; r < shards; ++r) {
        SCE_FUZZ_CHECK(restored[r]->Import(states[r], &placements[r]).ok());
      }
      SCE_FUZZ_CHECK(HeldRows(restored) == before);
      maps = std::move(restored);
    }
    step += in.ConsumeIntegralInRange<int64_t>(0, 2);
    std::vector<std::vector<uint64_t>> keys(shards);
    std::vector<uint64_t> batch(in.ConsumeIntegralInRange<size_t>(0, 30));
    for (uint64_t& key : batch) {
      key = universe[in.ConsumeIntegralInRange<size_t>(0, universe.size() - 1)];
      keys[sce::KeyOwnerShard(key, static_cast<int32_t>(shards))].push_back(key);
    }
    std::vector<std::vector<int32_t>> rows(shards);
    std::vector<int64_t> waiting(shards), free(shards);
    std::vector<uint64_t> new_keys;
    std::vector<int32_t> new_rows;
    sce::KeyRowMapStepStats stats;
    for (int64_t r = 0; r < shards; ++r) {
      rows[r].assign(keys[r].size(), sce::kNoRow);
      SCE_FUZZ_CHECK(maps[r]->MapStep(step, keys[r].data(), static_cast<int64_t>(keys[r].size()),
                                      rows[r].data(), &new_keys, &new_rows, &stats, true).ok());
      waiting[r] = maps[r]->waiting_keys();
      free[r] = maps[r]->FreeRows(&stats);
      SCE_FUZZ_CHECK(waiting[r] == 0 || free[r] == 0);
    }
    {   // lending more than is free fails and changes nothing
      const int64_t r = in.ConsumeIntegralInRange<int64_t>(0, shards - 1);
      std::vector<int32_t> none;
      SCE_FUZZ_CHECK(!maps[r]->LendRows(free[r] + 1, &none).ok() && none.empty());
      SCE_FUZZ_CHECK(maps[r]->FreeRows(&stats) == free[r]);
    }
    std::vector<std::vector<int32_t>> lent(shards);
    size_t lender = 0;
    for (int64_t r = 0; r < shards; ++r) {
      for (int64_t need = waiting[r]; need > 0;) {
        while (lender < static_cast<size_t>(shards) && free[lender] == 0) ++lender;
        if (lender == static_cast<size_t>(shards)) break;
        const int64_t take = std::min(need, free[lender]);
        SCE_FUZZ_CHECK(maps[lender]->LendRows(take, &lent[r]).ok());
        free[lender] -= take;
        need -= take;
      }
    }
    int64_t refused = 0, free_after = 0, held_after = 0;
    for (int64_t r = 0; r < shards; ++r) {
      SCE_FUZZ_CHECK(maps[r]->FinishStep(lent[r].data(), static_cast<int64_t>(lent[r].size()),
                                         keys[r].data(), static_cast<int64_t>(keys[r].size()),
                                         rows[r].data(), &new_keys, &new_rows, &stats).ok());
      refused += stats.refused_keys;
      maps[r]->ToTableRows(rows[r].data(), static_cast<int64_t>(rows[r].size()));
      free_after += maps[r]->FreeRows(&stats);
      held_after += maps[r]->size();
      // A second FinishStep has no waiting step to end.
      SCE_FUZZ_CHECK(!maps[r]->FinishStep(nullptr, 0, nullptr, 0, nullptr, &new_keys, &new_rows,
                                          &stats).ok());
    }
    SCE_FUZZ_CHECK(free_after + held_after == total);   // no row lost or duplicated
    if (refused > 0) SCE_FUZZ_CHECK(free_after == 0);
    refused_ever = refused_ever || refused > 0;
    const std::map<uint64_t, int32_t> held = HeldRows(maps);
    SCE_FUZZ_CHECK(static_cast<int64_t>(held.size()) <= total);
    for (int64_t r = 0; r < shards; ++r) {
      for (size_t i = 0; i < keys[r].size(); ++i) {
        const auto it = held.find(keys[r][i]);
        SCE_FUZZ_CHECK(rows[r][i] == (it == held.end() ? sce::kNoRow : it->second));
      }
    }
    std::vector<uint64_t> by_shard, admitted;
    for (const auto& part : keys) by_shard.insert(by_shard.end(), part.begin(), part.end());
    sce::KeyRowMapStepStats expected;
    reference.MapStep(step, by_shard, &admitted, &expected);
    refused_ever = refused_ever || expected.refused_keys > 0;
    if (!refused_ever) {
      const sce::KeyRowMapState want = reference.Export();
      std::vector<uint64_t> got;
      for (const auto& [key, row] : held) got.push_back(key);
      std::vector<uint64_t> sorted_want = want.keys;
      std::sort(sorted_want.begin(), sorted_want.end());
      SCE_FUZZ_CHECK(got == sorted_want);
    }
  }
  return 0;
}
