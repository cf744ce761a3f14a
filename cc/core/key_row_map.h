// The key-to-row map of one shard of an open-vocabulary table (docs/dynamic_vocabulary.md).
//
// An open vocabulary has no vocabulary size: its ids are arbitrary 64-bit keys. Each owner shard
// holds `capacity` rows and a map from the keys it owns to those rows. A step hands the map every
// occurrence of its keys (from every replica, in batch order); the map counts them, admits keys
// whose count reaches the admission threshold, takes rows back from keys not seen for
// `steps_to_live` steps, and answers each occurrence with a row or with kNoRow (the occurrence
// reads zeros and trains nothing).
//
// Everything here is deterministic: the answer is a function of the configuration and of the
// sequence of (step, keys) calls only. Which physical row a key gets is an internal detail; the
// logical state (which keys hold rows, their last-seen steps, the pending counts) is what
// Export() returns and Import() takes, independent of any topology.
#ifndef SCE_CORE_KEY_ROW_MAP_H_
#define SCE_CORE_KEY_ROW_MAP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/status.h"

namespace sce {

// The answer for an occurrence whose key holds no row.
constexpr int32_t kNoRow = -1;
// Rows (and pending keys) one shard's map may hold: 2^28, about 6 GiB of map at the largest.
constexpr int64_t kMaxKeyRowMapCapacity = kMaxAllocationElements;
// Steps are stored as int32 last-seen steps.
constexpr int64_t kMaxKeyRowMapStep = kMaxInt32;

struct KeyRowMapConfig {
  int64_t capacity = 1;             // rows of this shard, in [1, kMaxKeyRowMapCapacity]
  int64_t admission_threshold = 1;  // occurrences (in all steps so far) that earn a row, >= 1
  int64_t steps_to_live = 0;        // 0: rows are kept; T >= 1: lost after T steps unseen
  // Keys below the threshold whose counts are kept at once (unused with threshold 1), in
  // [1, kMaxKeyRowMapCapacity]. See KeyRowMap::MapStep for what happens when it is full.
  int64_t pending_capacity = 1;
  // The rows of the whole table, over all its shards' maps (0: `capacity`, one shard), and the
  // first of them that is this map's own row 0: its own rows are [first_row, first_row +
  // capacity). Rows of other shards can be lent to this map (KeyRowMap::LendRows/FinishStep);
  // every row the map answers with is a row of the whole table, in [0, total_rows).
  int64_t total_rows = 0;
  int64_t first_row = 0;
};

// Checks every field; `where` names the table in the message.
Status ValidateKeyRowMapConfig(const std::string& where, const KeyRowMapConfig& config);

// The owner shard of a key, in [0, num_shards) (num_shards >= 1): a fixed function of the key,
// from a 64-bit mix, so every key's owner is known without any table and keys spread evenly.
int32_t KeyOwnerShard(uint64_t key, int32_t num_shards);

// KeyOwnerShard of keys[0, n) into owners[0, n).
void KeyOwnerShards(const uint64_t* keys, int64_t n, int32_t num_shards, int32_t* owners);

// What one MapStep call did. "ids" count occurrences, "keys" count distinct keys.
struct KeyRowMapStepStats {
  int64_t admitted_keys = 0;   // keys given a row in this step
  int64_t evicted_keys = 0;    // keys whose rows were taken back in this step
  int64_t refused_keys = 0;    // keys that reached the threshold while every row was taken
  int64_t unadmitted_ids = 0;  // occurrences answered with kNoRow
  int64_t untracked_ids = 0;   // occurrences of new keys not counted: pending table full
  int64_t waiting_keys = 0;    // MapStep(wait=true): keys waiting for FinishStep's rows

  void Add(const KeyRowMapStepStats& other);
};

// The logical state of a map. Keys are ascending as signed int64 in both lists.
struct KeyRowMapState {
  int64_t last_step = -1;                  // the last step mapped; -1 before the first
  std::vector<uint64_t> keys;              // keys holding rows
  std::vector<int32_t> last_seen;          // their last-seen steps
  std::vector<int32_t> rows;               // their map rows (Export only; TableRow converts)
  std::vector<uint64_t> pending_keys;      // keys counted but below the threshold
  std::vector<int32_t> pending_counts;     // their counts, >= 1
  std::vector<int32_t> pending_last_seen;  // their last-seen steps
};

// Where an imported state's keys go when the table's shards lend rows (KeyRowMap::Import).
struct KeyRowMapPlacement {
  std::vector<int32_t> rows;       // per key of the state, its row of the whole table
  std::vector<int32_t> lent_rows;  // the map's own rows that other shards' keys hold
};

class KeyRowMap {
 public:
  // Validates `config` (naming `where`) and allocates the map for its capacities.
  static Status Create(const std::string& where, const KeyRowMapConfig& config,
                       std::unique_ptr<KeyRowMap>* map);

  // Maps one step's `num_keys` occurrences: rows[i] becomes keys[i]'s row or kNoRow. Steps
  // never decrease and lie in [0, kMaxKeyRowMapStep]; on a bad argument nothing changes.
  //
  // Rules, in batch order:
  // - With steps_to_live = T, a key last seen at step s0 has lost its row at step s when
  //   s - s0 > T (lazily: when it shows up again, or when a new key needs a row).
  // - A key without a row adds its occurrence to its count; the occurrence that brings the
  //   count to the threshold gives the key a row, and every occurrence of it in this step reads
  //   that row. A count is forgotten when its key gets a row, and (with T) after T steps unseen.
  // - A row comes from rows never used, then from rows taken back; with every row held, the key
  //   is refused (it stays pending and tries again when seen).
  // - When a new key finds `pending_capacity` keys pending, the pending keys not seen in this
  //   step are forgotten first; if the table is still full the occurrence is not counted.
  //
  // `new_keys` / `new_rows` receive the keys given a row in this step and their rows, in
  // admission order: their table values and optimizer slots must be (re)initialized before the
  // rows are read. `stats` describes the step. Rows here are the map's rows ([0, local_rows()));
  // TableRow gives their rows of the whole table.
  //
  // With `wait`, a key that reaches the threshold when no row is left is not refused: it waits
  // (stats->waiting_keys), and the step ends with FinishStep, which may have rows lent by other
  // shards for the waiting keys. Until then the occurrences of waiting keys, and those counted
  // before their key's admission, are not answered (rows[i] is left as it is).
  Status MapStep(int64_t step, const uint64_t* keys, int64_t num_keys, int32_t* rows,
                 std::vector<uint64_t>* new_keys, std::vector<int32_t>* new_rows,
                 KeyRowMapStepStats* stats, bool wait = false);

  // Rows the map can still give in its last step: free rows, rows never used, and rows of keys
  // expired by then (taken back now, which the step would do before refusing a key anyway).
  // After a MapStep(wait=true) with waiting keys it is 0.
  int64_t FreeRows(KeyRowMapStepStats* stats);
  // Keys waiting for FinishStep.
  int64_t waiting_keys() const { return wait_ ? static_cast<int64_t>(waiting_.size()) : 0; }

  // Gives `count` (<= FreeRows()) free rows to another shard's map, in the order this map would
  // have used them: they leave this map for good (a map that is lent one of its own rows back
  // holds it as a lent row). Their rows of the whole table are appended to `rows`. Call it
  // between a MapStep and its FinishStep, or after a step.
  Status LendRows(int64_t count, std::vector<int32_t>* rows);

  // Ends a MapStep(wait=true) with the same keys and rows arrays: the `count` rows of the whole
  // table in `lent` (given by other maps' LendRows) become this map's, the waiting keys take
  // them in the order they reached the threshold, the others are refused, and every occurrence
  // not yet answered is. new_keys/new_rows are appended to; `stats` describes this part.
  Status FinishStep(const int32_t* lent, int64_t count, const uint64_t* keys, int64_t num_keys,
                    int32_t* rows, std::vector<uint64_t>* new_keys,
                    std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats);

  // Rows given to keys and not yet confirmed reset, in admission order, each once. A caller
  // that (re)initializes the rows of new keys takes them from here and confirms them after its
  // writes: the rows of a step whose writes never ran (an aborted step) are handed out again.
  const std::vector<int32_t>& rows_to_reset() const { return rows_to_reset_; }
  // The key each of those rows was last given to (a string map's fingerprint): new rows'
  // initial values are drawn from their keys (key_values.h).
  const std::vector<uint64_t>& keys_to_reset() const { return keys_to_reset_; }
  // Removes the first `count` rows of rows_to_reset() (clamped to [0, its size]).
  void ConfirmReset(int64_t count);

  // Numbers the distinct rows of the last step's answers (`rows`, n of them, as MapStep gave
  // them, possibly with some turned to kNoRow): positions[i] becomes the index of rows[i] among
  // `unique_rows`, which receives each distinct row once, in order of first occurrence; every
  // kNoRow shares one entry (kNoRow). It is the deduplication a lookup needs, made from the
  // per-row metadata the step has just read (each row's last-seen step), without a sort or a
  // hash table: one pass, each row's metadata briefly holding its number. Nothing changes the
  // map. Fails, changing nothing, on a row outside [kNoRow, capacity) or a row not seen in the
  // last step (such rows were not answers of that step).
  Status NumberStepRows(const int32_t* rows, int64_t n, int32_t* positions,
                        std::vector<int32_t>* unique_rows);

  // Read-only lookup (inference): rows[i] becomes keys[i]'s row, or kNoRow when the key holds
  // none at the last step (expired keys included). Nothing changes: no count, no admission.
  void Find(const uint64_t* keys, int64_t num_keys, int32_t* rows) const;

  // The logical state after the last step. Keys that have lost their rows by then are left out;
  // every pending key is kept (a stale count is reset when its key shows up again, and stale keys
  // still take room in the pending table until a clean-up), so an imported state continues
  // exactly like the exported one.
  KeyRowMapState Export() const;

  // Replaces the whole state with `state` (its `rows` are ignored). Without `placement` the key
  // state.keys[i] gets the map's own row i, so a caller writes the saved values of key i into
  // table row first_row + i. With it, key i gets the table row placement->rows[i]: one of the
  // map's own rows or a row lent by another shard; placement->lent_rows are the map's own rows
  // that other shards' keys hold (they leave this map); its other own rows are free. Checks
  // everything first (sizes against the capacities, keys strictly ascending and distinct from
  // pending keys, counts >= 1, steps in range and not after last_step, rows distinct and in
  // range); on error nothing changes.
  Status Import(const KeyRowMapState& state, const KeyRowMapPlacement* placement = nullptr);

  // The row of the whole table of a row of this map ([0, local_rows())).
  int32_t TableRow(int32_t row) const {
    return row < config_.capacity ? static_cast<int32_t>(config_.first_row + row)
                                  : lent_[row - config_.capacity];
  }
  // TableRow of rows[0, n), in place; kNoRow stays.
  void ToTableRows(int32_t* rows, int64_t n) const;
  // Rows of this map: its own `capacity` and the rows other shards lent it.
  int64_t local_rows() const { return config_.capacity + static_cast<int64_t>(lent_.size()); }
  int64_t size() const { return size_; }                  // keys holding rows (live or not swept)
  int64_t pending_size() const { return pending_size_; }  // keys counted below the threshold
  int64_t last_step() const { return last_step_; }
  // Bytes of the map's buffers (slots, pending slots, per-row metadata).
  int64_t MemoryBytes() const;
  const KeyRowMapConfig& config() const { return config_; }

  // One slot of the key map: 12 bytes, so the map costs 16 bytes per key at its 3/4 load.
  struct Slot {
    uint32_t key_low;
    uint32_t key_high;
    int32_t row;  // kNoRow: empty
  };
  // One slot of the pending counts.
  struct PendingSlot {
    uint64_t key;
    int32_t count;  // 0: empty
    int32_t last_seen;
  };

 private:
  KeyRowMap(const std::string& where, const KeyRowMapConfig& config);
  Status Allocate();

  int64_t FindSlot(uint64_t key) const;
  int64_t FindPendingSlot(uint64_t key) const;
  void EraseSlot(int64_t slot);
  void ErasePendingSlot(int64_t slot);
  bool Expired(int32_t last_seen, int64_t step) const;
  void TakeRowBack(int32_t row, KeyRowMapStepStats* stats);
  int32_t TakeFreeRow(int64_t step, KeyRowMapStepStats* stats);
  void SweepExpiredRows(int64_t step, KeyRowMapStepStats* stats);
  // `empty_slot`: the empty slot where the key would go, or -1 when not known.
  int32_t Admit(uint64_t key, int64_t empty_slot, int64_t step, std::vector<uint64_t>* new_keys,
                std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats);
  int32_t CountMissedKey(uint64_t key, int64_t empty_slot, int64_t step, bool* deferred,
                         std::vector<uint64_t>* new_keys, std::vector<int32_t>* new_rows,
                         KeyRowMapStepStats* stats);
  void ForgetStalePending(int64_t step);
  void ClearAll();
  void Unlist(int32_t row);
  // Room in the key map for `keys` keys (grows it, moving every key, when it has less).
  Status ReserveKeys(int64_t keys);
  Status AddLentRows(const int32_t* lent, int64_t count);
  void AnswerDeferred(const uint64_t* keys, int32_t* rows, KeyRowMapStepStats* stats);
  int64_t TotalRows() const {
    return config_.total_rows > 0 ? config_.total_rows : config_.capacity;
  }

  std::string where_;
  KeyRowMapConfig config_;
  int64_t num_slots_ = 0;
  int64_t num_pending_slots_ = 0;
  std::vector<Slot> slots_;
  std::vector<PendingSlot> pending_;
  // Per row: the slot of its key (a held row) or the next free row (a free row), and the step
  // its key was last seen (-1: free). 8 bytes per row.
  std::vector<int32_t> row_slot_;
  std::vector<int32_t> row_last_seen_;
  std::vector<int32_t> rows_to_reset_;
  std::vector<uint64_t> keys_to_reset_;  // parallel to rows_to_reset_
  std::vector<bool> reset_pending_;  // per row: listed in rows_to_reset_ (1 bit per row)
  // Rows lent by other shards: map row capacity + j is table row lent_[j]; rows lent on again
  // leave their index to the next lent row (spare_lent_).
  std::vector<int32_t> lent_;
  std::vector<int32_t> spare_lent_;
  int32_t free_head_ = kNoRow;    // taken-back rows, last taken back first
  int64_t free_count_ = 0;        // rows in that list
  int64_t next_unused_ = 0;       // rows [next_unused_, capacity) were never used
  int64_t oldest_last_seen_ = 0;  // no held row was last seen before this step
  int64_t size_ = 0;
  int64_t pending_size_ = 0;
  int64_t last_step_ = -1;
  // Per-step memory: the step of the last sweep / pending clean-up, and refused keys.
  int64_t swept_step_ = -1;
  int64_t pending_cleaned_step_ = -1;
  std::vector<uint64_t> refused_;
  std::vector<int64_t> deferred_;
  std::vector<uint64_t> waiting_;  // MapStep(wait=true): keys waiting for rows, in order
  bool wait_ = false;              // the last MapStep waits for its FinishStep
};

}  // namespace sce

#endif  // SCE_CORE_KEY_ROW_MAP_H_
