// String keys for an open-vocabulary table (docs/dynamic_vocabulary.md#string-keys).
//
// A string key is mapped through its 64-bit fingerprint, computed by the caller (TensorFlow's
// tf.fingerprint, so the owner shard of a string is known to stock ops too): the fingerprint is
// the key of a KeyRowMap, and each row also keeps the string it was given to. Two strings with
// one fingerprint therefore never share a row: the string that holds the row reads it, and the
// other is answered kNoRow and counted as collided. Pending counts are kept per fingerprint.
#ifndef SCE_CORE_STRING_KEY_ROW_MAP_H_
#define SCE_CORE_STRING_KEY_ROW_MAP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/key_row_map.h"
#include "cc/core/status.h"

namespace sce {

// The logical state of a string map: held keys ascending by their bytes; pending counts per
// fingerprint (ascending as signed int64), as in KeyRowMapState.
struct StringKeyRowMapState {
  int64_t last_step = -1;
  std::vector<std::string> keys;
  std::vector<uint64_t> fingerprints;  // of `keys`, in the same order
  std::vector<int32_t> last_seen;
  std::vector<int32_t> rows;  // Export only
  std::vector<uint64_t> pending_fingerprints;
  std::vector<int32_t> pending_counts;
  std::vector<int32_t> pending_last_seen;
};

class StringKeyRowMap {
 public:
  static Status Create(const std::string& where, const KeyRowMapConfig& config,
                       std::unique_ptr<StringKeyRowMap>* map);

  // KeyRowMap::MapStep for keys[i] with fingerprints[i]. `new_rows` receive the rows given to
  // keys in this step (the caller initializes them); `collided_ids` counts occurrences answered
  // kNoRow because their fingerprint's row belongs to another string (they are also counted in
  // stats->unadmitted_ids).
  Status MapStep(int64_t step, const std::string_view* keys, const uint64_t* fingerprints,
                 int64_t num_keys, int32_t* rows, std::vector<int32_t>* new_rows,
                 KeyRowMapStepStats* stats, int64_t* collided_ids, bool wait = false);

  // KeyRowMap::FinishStep after a MapStep(wait=true) with the same keys and rows; the strings
  // are matched to rows (and collisions answered kNoRow) once every occurrence has its answer.
  // `new_rows` receives every row given in the step (MapStep's part included).
  Status FinishStep(const int32_t* lent, int64_t count, const std::string_view* keys,
                    const uint64_t* fingerprints, int64_t num_keys, int32_t* rows,
                    std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats,
                    int64_t* collided_ids);

  // Held keys ascending by bytes, with their fingerprints, rows and last-seen steps; pending
  // counts per fingerprint.
  StringKeyRowMapState Export() const;

  // Read-only lookup (inference): each string's row, or kNoRow when it holds none at the last
  // step (a string whose fingerprint another string holds included). Nothing changes.
  void Find(const std::string_view* keys, const uint64_t* fingerprints, int64_t num_keys,
            int32_t* rows) const;

  // Replaces the state (keys in any order, with their fingerprints; `rows` ignored). The key
  // with the i-th smallest fingerprint gets row i; Export then gives each key's row. Fails,
  // changing nothing, on a repeated key, two keys with one fingerprint, or whatever
  // KeyRowMap::Import rejects.
  // With `placement` (KeyRowMap::Import), its rows follow the state's keys in their given order.
  Status Import(const StringKeyRowMapState& state,
                const KeyRowMapPlacement* placement = nullptr);

  const KeyRowMap& key_map() const { return *map_; }
  // The key map itself, for its rows_to_reset / ConfirmReset (the strings need no reset).
  KeyRowMap* mutable_key_map() { return map_.get(); }
  // The key map's bytes plus the rows' strings (their heap characters not counted).
  int64_t MemoryBytes() const {
    return map_->MemoryBytes() + static_cast<int64_t>(row_keys_.size() * sizeof(std::string));
  }
  // The string a row was last given to (the keys of MapStep's new_rows, once it returned).
  const std::string& row_key(int32_t row) const { return row_keys_[row]; }

 private:
  StringKeyRowMap(std::string where, std::unique_ptr<KeyRowMap> map);
  // Matches the strings of answered occurrences to the rows given in this step (`given`).
  void MatchStrings(const std::string_view* keys, int64_t num_keys, int32_t* rows,
                    const std::vector<int32_t>& given, KeyRowMapStepStats* stats,
                    int64_t* collided_ids);
  // Per-row arrays for every row of the map (it grows when rows are lent to it).
  Status FitRows();

  std::string where_;
  std::unique_ptr<KeyRowMap> map_;
  std::vector<std::string> row_keys_;  // the string each row was last given to
  // Rows given out in the current step whose first reader is not met yet (all clear between
  // steps: every new row has a reader, the occurrence that admitted its key).
  std::vector<bool> row_is_new_;
  std::vector<uint64_t> fingerprint_scratch_;
  std::vector<uint64_t> new_fingerprints_;
  std::vector<int32_t> waiting_new_rows_;  // rows MapStep(wait=true) gave, for FinishStep
};

}  // namespace sce

#endif  // SCE_CORE_STRING_KEY_ROW_MAP_H_
