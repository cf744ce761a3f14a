#include "cc/core/string_key_row_map.h"

#include <algorithm>
#include <new>
#include <numeric>
#include <utility>

namespace sce {
namespace {

bool SignedLess(uint64_t a, uint64_t b) {
  return static_cast<int64_t>(a) < static_cast<int64_t>(b);
}

}  // namespace

StringKeyRowMap::StringKeyRowMap(std::string where, std::unique_ptr<KeyRowMap> map)
    : where_(std::move(where)), map_(std::move(map)) {}

Status StringKeyRowMap::Create(const std::string& where, const KeyRowMapConfig& config,
                               std::unique_ptr<StringKeyRowMap>* map) {
  std::unique_ptr<KeyRowMap> key_map;
  SCE_RETURN_IF_ERROR(KeyRowMap::Create(where, config, &key_map));
  std::unique_ptr<StringKeyRowMap> created(new StringKeyRowMap(where, std::move(key_map)));
  try {
    created->row_keys_.resize(config.capacity);
    created->row_is_new_.assign(config.capacity, false);
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where, ": cannot allocate the key strings for capacity ",
                           config.capacity);
  }
  *map = std::move(created);
  return Status::Ok();
}

Status StringKeyRowMap::MapStep(int64_t step, const std::string_view* keys,
                                const uint64_t* fingerprints, int64_t num_keys, int32_t* rows,
                                std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats,
                                int64_t* collided_ids, bool wait) {
  if (num_keys > 0 && keys == nullptr) {
    return InvalidArgument(where_, ": bad string key map arguments (", num_keys, " keys)");
  }
  if (collided_ids == nullptr) return InvalidArgument(where_, ": no collided_ids output");
  SCE_RETURN_IF_ERROR(map_->MapStep(step, fingerprints, num_keys, rows, &new_fingerprints_,
                                    new_rows, stats, wait));
  *collided_ids = 0;
  if (wait) {   // strings are matched once FinishStep has answered every occurrence
    waiting_new_rows_ = *new_rows;
    return Status::Ok();
  }
  MatchStrings(keys, num_keys, rows, *new_rows, stats, collided_ids);
  return Status::Ok();
}

Status StringKeyRowMap::FinishStep(const int32_t* lent, int64_t count,
                                   const std::string_view* keys, const uint64_t* fingerprints,
                                   int64_t num_keys, int32_t* rows,
                                   std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats,
                                   int64_t* collided_ids) {
  if ((num_keys > 0 && keys == nullptr) || collided_ids == nullptr || new_rows == nullptr) {
    return InvalidArgument(where_, ": bad string key map arguments (", num_keys, " keys)");
  }
  new_rows->clear();
  SCE_RETURN_IF_ERROR(map_->FinishStep(lent, count, fingerprints, num_keys, rows,
                                       &new_fingerprints_, new_rows, stats));
  SCE_RETURN_IF_ERROR(FitRows());
  *collided_ids = 0;
  // Every row given in the step: MapStep's part (not reported while waiting) and this one's.
  new_rows->insert(new_rows->begin(), waiting_new_rows_.begin(), waiting_new_rows_.end());
  waiting_new_rows_.clear();
  MatchStrings(keys, num_keys, rows, *new_rows, stats, collided_ids);
  return Status::Ok();
}

Status StringKeyRowMap::FitRows() {
  const size_t rows = static_cast<size_t>(map_->local_rows());
  if (row_keys_.size() >= rows) return Status::Ok();
  try {
    row_keys_.resize(rows);
    row_is_new_.resize(rows, false);
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where_, ": cannot hold the strings of ", rows, " rows");
  }
  return Status::Ok();
}

void StringKeyRowMap::MatchStrings(const std::string_view* keys, int64_t num_keys, int32_t* rows,
                                   const std::vector<int32_t>& given, KeyRowMapStepStats* stats,
                                   int64_t* collided_ids) {
  // A row given out in this step belongs to the first string that reads it in batch order.
  for (int32_t row : given) row_is_new_[row] = true;
  for (int64_t i = 0; i < num_keys; ++i) {
    const int32_t row = rows[i];
    if (row == kNoRow) continue;
    if (row_is_new_[row]) {
      row_keys_[row].assign(keys[i].data(), keys[i].size());
      row_is_new_[row] = false;
      continue;
    }
    if (row_keys_[row] != keys[i]) {
      rows[i] = kNoRow;
      ++*collided_ids;
      ++stats->unadmitted_ids;
    }
  }
}

void StringKeyRowMap::Find(const std::string_view* keys, const uint64_t* fingerprints,
                           int64_t num_keys, int32_t* rows) const {
  map_->Find(fingerprints, num_keys, rows);
  for (int64_t i = 0; i < num_keys; ++i) {
    if (rows[i] != kNoRow && row_keys_[rows[i]] != keys[i]) rows[i] = kNoRow;
  }
}

StringKeyRowMapState StringKeyRowMap::Export() const {
  const KeyRowMapState inner = map_->Export();
  std::vector<int64_t> order(inner.keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return row_keys_[inner.rows[a]] < row_keys_[inner.rows[b]];
  });
  StringKeyRowMapState state;
  state.last_step = inner.last_step;
  for (int64_t i : order) {
    state.keys.push_back(row_keys_[inner.rows[i]]);
    state.fingerprints.push_back(inner.keys[i]);
    state.last_seen.push_back(inner.last_seen[i]);
    state.rows.push_back(inner.rows[i]);
  }
  state.pending_fingerprints = inner.pending_keys;
  state.pending_counts = inner.pending_counts;
  state.pending_last_seen = inner.pending_last_seen;
  return state;
}

Status StringKeyRowMap::Import(const StringKeyRowMapState& state,
                               const KeyRowMapPlacement* placement) {
  const size_t n = state.keys.size();
  if (state.fingerprints.size() != n || state.last_seen.size() != n) {
    return InvalidArgument(where_, ": the saved keys, fingerprints and last-seen steps differ in "
                           "size");
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return SignedLess(state.fingerprints[a], state.fingerprints[b]);
  });
  KeyRowMapState inner;
  inner.last_step = state.last_step;
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = order[i];
    if (i > 0 && state.fingerprints[order[i - 1]] == state.fingerprints[k]) {
      const std::string& other = state.keys[order[i - 1]];
      if (other == state.keys[k]) {
        return InvalidArgument(where_, ": the saved key '", other, "' appears twice");
      }
      return InvalidArgument(where_, ": the saved keys '", other, "' and '", state.keys[k],
                             "' have the same fingerprint");
    }
    inner.keys.push_back(state.fingerprints[k]);
    inner.last_seen.push_back(state.last_seen[k]);
  }
  inner.pending_keys = state.pending_fingerprints;
  inner.pending_counts = state.pending_counts;
  inner.pending_last_seen = state.pending_last_seen;
  if (placement == nullptr) {
    SCE_RETURN_IF_ERROR(map_->Import(inner));
    for (size_t i = 0; i < n; ++i) row_keys_[i] = state.keys[order[i]];
    return Status::Ok();
  }
  if (placement->rows.size() != n) {
    return InvalidArgument(where_, ": the placement has ", placement->rows.size(), " rows for ",
                           n, " keys");
  }
  KeyRowMapPlacement ordered{{}, placement->lent_rows};
  for (size_t i = 0; i < n; ++i) ordered.rows.push_back(placement->rows[order[i]]);
  SCE_RETURN_IF_ERROR(map_->Import(inner, &ordered));
  SCE_RETURN_IF_ERROR(FitRows());
  std::vector<int32_t> rows(n);
  map_->Find(inner.keys.data(), static_cast<int64_t>(n), rows.data());
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] != kNoRow) row_keys_[rows[i]] = state.keys[order[i]];   // else expired already
  }
  return Status::Ok();
}

}  // namespace sce
