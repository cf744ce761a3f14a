// A slow, obviously-correct model of sce::KeyRowMap's logical behaviour (std::map, no rows), for
// the unit tests and the fuzz target: which occurrences get a row, which keys are admitted in
// which order, which are refused, and the exported state. Physical rows are not modelled; the
// callers check them with invariants (two keys never share a row; a key keeps its row while it
// holds one).
#ifndef SCE_CC_TESTS_KEY_ROW_MAP_REFERENCE_H_
#define SCE_CC_TESTS_KEY_ROW_MAP_REFERENCE_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "cc/core/key_row_map.h"

namespace sce_testing {

class ReferenceKeyRowMap {
 public:
  explicit ReferenceKeyRowMap(const sce::KeyRowMapConfig& config) : config_(config) {}

  // Returns, per occurrence, whether it reads a row; appends admitted keys in admission order.
  std::vector<bool> MapStep(int64_t step, const std::vector<uint64_t>& keys,
                            std::vector<uint64_t>* admitted, sce::KeyRowMapStepStats* stats) {
    *stats = sce::KeyRowMapStepStats();
    admitted->clear();
    last_step_ = step;
    std::vector<bool> has_row(keys.size(), false);
    std::vector<size_t> deferred;
    std::set<int64_t> refused;
    bool cleaned = false;
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t key = static_cast<int64_t>(keys[i]);
      auto held = held_.find(key);
      if (held != held_.end()) {
        if (!Expired(held->second, step)) {
          held->second = step;
          has_row[i] = true;
          continue;
        }
        held_.erase(held);
      }
      bool is_deferred = false;
      bool admit = config_.admission_threshold == 1;
      if (!admit) {
        auto pending = pending_.find(key);
        if (pending == pending_.end()) {
          if (static_cast<int64_t>(pending_.size()) >= config_.pending_capacity) {
            if (!cleaned) {
              cleaned = true;
              for (auto it = pending_.begin(); it != pending_.end();) {
                it = it->second.second == step ? std::next(it) : pending_.erase(it);
              }
            }
            if (static_cast<int64_t>(pending_.size()) >= config_.pending_capacity) {
              ++stats->untracked_ids;
              ++stats->unadmitted_ids;
              continue;
            }
          }
          pending = pending_.emplace(key, std::make_pair(int64_t{0}, step)).first;
        }
        auto& [count, last_seen] = pending->second;
        if (Expired(last_seen, step)) count = 0;
        last_seen = step;
        if (count < config_.admission_threshold) ++count;
        admit = count >= config_.admission_threshold;
        is_deferred = !admit;
      }
      if (admit) {
        if (LiveKeys(step) < config_.capacity) {
          held_[key] = step;
          pending_.erase(key);
          admitted->push_back(keys[i]);
          ++stats->admitted_keys;
          has_row[i] = true;
          continue;
        }
        refused.insert(key);
      }
      if (is_deferred) {
        deferred.push_back(i);
      } else {
        ++stats->unadmitted_ids;
      }
    }
    for (size_t i : deferred) {
      has_row[i] = held_.count(static_cast<int64_t>(keys[i])) > 0;
      if (!has_row[i]) ++stats->unadmitted_ids;
    }
    stats->refused_keys = static_cast<int64_t>(refused.size());
    return has_row;
  }

  // The logical state (rows left empty).
  sce::KeyRowMapState Export() const {
    sce::KeyRowMapState state;
    state.last_step = last_step_;
    for (const auto& [key, last_seen] : held_) {
      if (Expired(last_seen, last_step_)) continue;
      state.keys.push_back(static_cast<uint64_t>(key));
      state.last_seen.push_back(static_cast<int32_t>(last_seen));
    }
    for (const auto& [key, entry] : pending_) {
      state.pending_keys.push_back(static_cast<uint64_t>(key));
      state.pending_counts.push_back(static_cast<int32_t>(entry.first));
      state.pending_last_seen.push_back(static_cast<int32_t>(entry.second));
    }
    return state;
  }

 private:
  bool Expired(int64_t last_seen, int64_t step) const {
    return config_.steps_to_live > 0 && step - last_seen > config_.steps_to_live;
  }
  int64_t LiveKeys(int64_t step) const {
    int64_t live = 0;
    for (const auto& [key, last_seen] : held_) live += !Expired(last_seen, step);
    return live;
  }

  sce::KeyRowMapConfig config_;
  int64_t last_step_ = -1;
  std::map<int64_t, int64_t> held_;                             // key -> last seen
  std::map<int64_t, std::pair<int64_t, int64_t>> pending_;      // key -> (count, last seen)
};

}  // namespace sce_testing

#endif  // SCE_CC_TESTS_KEY_ROW_MAP_REFERENCE_H_
