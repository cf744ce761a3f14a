// Open addressing with linear probing over two tables: the key map (12-byte slots, load <= 3/4)
// and the pending counts (16-byte slots, load <= 3/4). Deletion shifts later entries of the
// probe run back (no tombstones), so lookups never slow down as keys come and go.
#include "cc/core/key_row_map.h"

#include <algorithm>
#include <new>
#include <unordered_set>
#include <utility>

#include "cc/core/huge_pages.h"
#include "cc/core/key_hash.h"

namespace sce {
namespace {

// The owner hash and the slot hash must be independent: a shard's keys share their owner hash
// range, and the slot hash must still spread them over all of the shard's slots.
constexpr uint64_t kOwnerSalt = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kPendingSalt = 0x632be59bd9b4e019ULL;

// Slots for `entries` at a load of at most 3/4, and always one more than `entries` so a probe
// for an absent key ends at an empty slot.
int64_t SlotsFor(int64_t entries) { return entries + (entries + 2) / 3 + 1; }

inline uint64_t KeyOf(const KeyRowMap::Slot& slot) {
  return (static_cast<uint64_t>(slot.key_high) << 32) | slot.key_low;
}

inline bool KeyLess(uint64_t a, uint64_t b) {
  return static_cast<int64_t>(a) < static_cast<int64_t>(b);
}

// "The key's empty slot is not known": Admit finds it.
constexpr int64_t kUnknownSlot = -1;

// Whether `home` lies cyclically in (hole, slot]: then the entry at `slot` cannot move to `hole`.
inline bool HomeBetween(int64_t hole, int64_t home, int64_t slot) {
  return hole <= slot ? (hole < home && home <= slot) : (hole < home || home <= slot);
}

}  // namespace

Status ValidateKeyRowMapConfig(const std::string& where, const KeyRowMapConfig& config) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "capacity", config.capacity, 1, kMaxKeyRowMapCapacity));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "admission_threshold", config.admission_threshold, 1,
                                   kMaxInt32));
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "steps_to_live", config.steps_to_live, 0, kMaxKeyRowMapStep));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "pending_capacity", config.pending_capacity, 1,
                                   kMaxKeyRowMapCapacity));
  if (config.total_rows != 0) {
    SCE_RETURN_IF_ERROR(
        CheckInRange(where, "total_rows", config.total_rows, config.capacity, kMaxInt32));
    SCE_RETURN_IF_ERROR(CheckInRange(where, "first_row", config.first_row, 0,
                                     config.total_rows - config.capacity));
  } else if (config.first_row != 0) {
    return InvalidArgument(where, ": first_row ", config.first_row,
                           " needs total_rows (the rows of every shard)");
  }
  return Status::Ok();
}

void KeyRowMapStepStats::Add(const KeyRowMapStepStats& other) {
  admitted_keys += other.admitted_keys;
  evicted_keys += other.evicted_keys;
  refused_keys += other.refused_keys;
  unadmitted_ids += other.unadmitted_ids;
  untracked_ids += other.untracked_ids;
  waiting_keys += other.waiting_keys;
}

int32_t KeyOwnerShard(uint64_t key, int32_t num_shards) {
  if (num_shards <= 1) return 0;
  return static_cast<int32_t>(MultiplyHigh(Mix64(key ^ kOwnerSalt), num_shards));
}

void KeyOwnerShards(const uint64_t* keys, int64_t n, int32_t num_shards, int32_t* owners) {
  for (int64_t i = 0; i < n; ++i) owners[i] = KeyOwnerShard(keys[i], num_shards);
}

KeyRowMap::KeyRowMap(const std::string& where, const KeyRowMapConfig& config)
    : where_(where), config_(config) {}

Status KeyRowMap::Create(const std::string& where, const KeyRowMapConfig& config,
                         std::unique_ptr<KeyRowMap>* map) {
  SCE_RETURN_IF_ERROR(ValidateKeyRowMapConfig(where, config));
  std::unique_ptr<KeyRowMap> created(new KeyRowMap(where, config));
  SCE_RETURN_IF_ERROR(created->Allocate());
  *map = std::move(created);
  return Status::Ok();
}

Status KeyRowMap::Allocate() {
  num_slots_ = SlotsFor(config_.capacity);
  num_pending_slots_ = config_.admission_threshold > 1 ? SlotsFor(config_.pending_capacity) : 0;
  try {
    // Every key costs a random access to each of these: with 2 MiB pages they cost no page walk
    // (docs/lookup.md#huge-pages). Advised before the first write, so no page needs collapsing.
    slots_.reserve(num_slots_);
    pending_.reserve(num_pending_slots_);
    row_slot_.reserve(config_.capacity);
    row_last_seen_.reserve(config_.capacity);
    BackWithHugePages(slots_.data(), num_slots_ * static_cast<int64_t>(sizeof(Slot)));
    BackWithHugePages(pending_.data(), num_pending_slots_ * static_cast<int64_t>(sizeof(PendingSlot)));
    BackWithHugePages(row_slot_.data(), config_.capacity * static_cast<int64_t>(sizeof(int32_t)));
    BackWithHugePages(row_last_seen_.data(),
                      config_.capacity * static_cast<int64_t>(sizeof(int32_t)));
    slots_.assign(num_slots_, Slot{0, 0, kNoRow});
    pending_.assign(num_pending_slots_, PendingSlot{0, 0, 0});
    row_slot_.assign(config_.capacity, kNoRow);
    row_last_seen_.assign(config_.capacity, -1);
    reset_pending_.assign(config_.capacity, false);
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where_, ": cannot allocate the key map for capacity ",
                           config_.capacity, " and pending_capacity ", config_.pending_capacity);
  }
  return Status::Ok();
}

int64_t KeyRowMap::MemoryBytes() const {
  const int64_t rows = local_rows();
  return num_slots_ * static_cast<int64_t>(sizeof(Slot)) +
         num_pending_slots_ * static_cast<int64_t>(sizeof(PendingSlot)) +
         rows * static_cast<int64_t>(sizeof(int32_t) + sizeof(int32_t)) + (rows + 7) / 8 +
         static_cast<int64_t>(lent_.size() + spare_lent_.size()) *
             static_cast<int64_t>(sizeof(int32_t));
}

void KeyRowMap::ToTableRows(int32_t* rows, int64_t n) const {
  if (config_.first_row == 0 && lent_.empty()) return;   // one shard: every row is its own
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] != kNoRow) rows[i] = TableRow(rows[i]);
  }
}

void KeyRowMap::ClearAll() {
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, kNoRow});
  std::fill(pending_.begin(), pending_.end(), PendingSlot{0, 0, 0});
  std::fill(row_slot_.begin(), row_slot_.end(), kNoRow);
  std::fill(row_last_seen_.begin(), row_last_seen_.end(), -1);
  row_slot_.resize(config_.capacity);
  row_last_seen_.resize(config_.capacity);
  reset_pending_.assign(config_.capacity, false);
  lent_.clear();
  spare_lent_.clear();
  waiting_.clear();
  wait_ = false;
  rows_to_reset_.clear();
  keys_to_reset_.clear();
  free_head_ = kNoRow;
  free_count_ = 0;
  next_unused_ = 0;
  oldest_last_seen_ = 0;
  size_ = 0;
  pending_size_ = 0;
  last_step_ = -1;
  swept_step_ = -1;
  pending_cleaned_step_ = -1;
}

// ---- The two hash tables -------------------------------------------------------------------

int64_t KeyRowMap::FindSlot(uint64_t key) const {
  int64_t slot = static_cast<int64_t>(MultiplyHigh(Mix64(key), num_slots_));
  while (true) {
    const Slot& s = slots_[slot];
    if (s.row == kNoRow || KeyOf(s) == key) return slot;
    if (++slot == num_slots_) slot = 0;
  }
}

int64_t KeyRowMap::FindPendingSlot(uint64_t key) const {
  int64_t slot = static_cast<int64_t>(MultiplyHigh(Mix64(key ^ kPendingSalt), num_pending_slots_));
  while (true) {
    const PendingSlot& s = pending_[slot];
    if (s.count == 0 || s.key == key) return slot;
    if (++slot == num_pending_slots_) slot = 0;
  }
}

void KeyRowMap::EraseSlot(int64_t hole) {
  int64_t slot = hole;
  while (true) {
    if (++slot == num_slots_) slot = 0;
    const Slot& s = slots_[slot];
    if (s.row == kNoRow) break;
    const int64_t home = static_cast<int64_t>(MultiplyHigh(Mix64(KeyOf(s)), num_slots_));
    if (HomeBetween(hole, home, slot)) continue;
    slots_[hole] = s;
    row_slot_[s.row] = static_cast<int32_t>(hole);
    hole = slot;
  }
  slots_[hole] = Slot{0, 0, kNoRow};
}

void KeyRowMap::ErasePendingSlot(int64_t hole) {
  int64_t slot = hole;
  while (true) {
    if (++slot == num_pending_slots_) slot = 0;
    const PendingSlot& s = pending_[slot];
    if (s.count == 0) break;
    const int64_t home =
        static_cast<int64_t>(MultiplyHigh(Mix64(s.key ^ kPendingSalt), num_pending_slots_));
    if (HomeBetween(hole, home, slot)) continue;
    pending_[hole] = s;
    hole = slot;
  }
  pending_[hole] = PendingSlot{0, 0, 0};
  --pending_size_;
}

// ---- Rows ----------------------------------------------------------------------------------

bool KeyRowMap::Expired(int32_t last_seen, int64_t step) const {
  return config_.steps_to_live > 0 && step - last_seen > config_.steps_to_live;
}

void KeyRowMap::TakeRowBack(int32_t row, KeyRowMapStepStats* stats) {
  EraseSlot(row_slot_[row]);
  row_last_seen_[row] = -1;
  row_slot_[row] = free_head_;
  free_head_ = row;
  ++free_count_;
  --size_;
  ++stats->evicted_keys;
}

// Every held row whose key has expired goes back to the free list, in row order. Runs at most
// once per step (a row seen in this step cannot expire in it) and only when the oldest held row
// may have expired.
void KeyRowMap::SweepExpiredRows(int64_t step, KeyRowMapStepStats* stats) {
  swept_step_ = step;
  int64_t oldest = step;
  const int64_t rows = local_rows();
  for (int64_t row = 0; row < rows; ++row) {
    if (row == next_unused_) row = config_.capacity;   // own rows never used: skipped
    if (row == rows) break;
    const int32_t last_seen = row_last_seen_[row];
    if (last_seen < 0) continue;
    if (Expired(last_seen, step)) {
      TakeRowBack(static_cast<int32_t>(row), stats);
    } else {
      oldest = std::min<int64_t>(oldest, last_seen);
    }
  }
  oldest_last_seen_ = oldest;
}

int32_t KeyRowMap::TakeFreeRow(int64_t step, KeyRowMapStepStats* stats) {
  if (free_head_ == kNoRow && next_unused_ == config_.capacity && config_.steps_to_live > 0 &&
      swept_step_ != step && Expired(static_cast<int32_t>(oldest_last_seen_), step)) {
    SweepExpiredRows(step, stats);
  }
  if (free_head_ != kNoRow) {
    const int32_t row = free_head_;
    free_head_ = row_slot_[row];
    --free_count_;
    return row;
  }
  if (next_unused_ < config_.capacity) return static_cast<int32_t>(next_unused_++);
  return kNoRow;
}

int32_t KeyRowMap::Admit(uint64_t key, int64_t empty_slot, int64_t step,
                         std::vector<uint64_t>* new_keys, std::vector<int32_t>* new_rows,
                         KeyRowMapStepStats* stats) {
  const int64_t swept_before = swept_step_;
  const int32_t row = TakeFreeRow(step, stats);
  if (row == kNoRow) {
    (wait_ ? waiting_ : refused_).push_back(key);
    return kNoRow;
  }
  // A sweep moves entries: then the key's empty slot is found again.
  const int64_t slot =
      empty_slot == kUnknownSlot || swept_step_ != swept_before ? FindSlot(key) : empty_slot;
  slots_[slot] = Slot{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), row};
  row_slot_[row] = static_cast<int32_t>(slot);
  row_last_seen_[row] = static_cast<int32_t>(step);
  ++size_;
  ++stats->admitted_keys;
  new_keys->push_back(key);
  new_rows->push_back(row);
  if (!reset_pending_[row]) {
    reset_pending_[row] = true;
    rows_to_reset_.push_back(row);
    keys_to_reset_.push_back(key);
  } else {
    // Listed by a step whose writes never ran, and given out again: it is reset for its new key.
    const auto listed = std::find(rows_to_reset_.begin(), rows_to_reset_.end(), row);
    keys_to_reset_[listed - rows_to_reset_.begin()] = key;
  }
  return row;
}

// ---- Pending counts ------------------------------------------------------------------------

// Forgets every pending key not seen in `step`; at most once per step.
void KeyRowMap::ForgetStalePending(int64_t step) {
  pending_cleaned_step_ = step;
  std::vector<PendingSlot> kept;
  for (const PendingSlot& s : pending_) {
    if (s.count != 0 && s.last_seen == step) kept.push_back(s);
  }
  std::fill(pending_.begin(), pending_.end(), PendingSlot{0, 0, 0});
  pending_size_ = 0;
  for (const PendingSlot& s : kept) {
    pending_[FindPendingSlot(s.key)] = s;
    ++pending_size_;
  }
}

// An occurrence of a key that holds no row. Returns its row if this occurrence admits it;
// otherwise kNoRow, with *deferred set when the key may still be admitted later in this step.
int32_t KeyRowMap::CountMissedKey(uint64_t key, int64_t empty_slot, int64_t step, bool* deferred,
                                  std::vector<uint64_t>* new_keys,
                                  std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats) {
  *deferred = false;
  if (config_.admission_threshold == 1) {
    const int32_t row = Admit(key, empty_slot, step, new_keys, new_rows, stats);
    *deferred = row == kNoRow && wait_;
    return row;
  }
  int64_t slot = FindPendingSlot(key);
  if (pending_[slot].count == 0) {
    if (pending_size_ >= config_.pending_capacity) {
      if (pending_cleaned_step_ != step) ForgetStalePending(step);
      if (pending_size_ >= config_.pending_capacity) {
        ++stats->untracked_ids;
        return kNoRow;
      }
      slot = FindPendingSlot(key);
    }
    pending_[slot] = PendingSlot{key, 0, static_cast<int32_t>(step)};
    ++pending_size_;
  }
  PendingSlot& entry = pending_[slot];
  if (Expired(entry.last_seen, step)) entry.count = 0;
  entry.last_seen = static_cast<int32_t>(step);
  if (entry.count < config_.admission_threshold) ++entry.count;
  if (entry.count < config_.admission_threshold) {
    *deferred = true;
    return kNoRow;
  }
  const int32_t row = Admit(key, empty_slot, step, new_keys, new_rows, stats);
  if (row != kNoRow) ErasePendingSlot(slot);
  if (row == kNoRow && wait_) *deferred = true;   // FinishStep may still give it a row
  return row;
}

// ---- Steps ---------------------------------------------------------------------------------

Status KeyRowMap::MapStep(int64_t step, const uint64_t* keys, int64_t num_keys, int32_t* rows,
                          std::vector<uint64_t>* new_keys, std::vector<int32_t>* new_rows,
                          KeyRowMapStepStats* stats, bool wait) {
  SCE_RETURN_IF_ERROR(CheckInRange(where_, "step", step, 0, kMaxKeyRowMapStep));
  if (step < last_step_) {
    return InvalidArgument(where_, ": step ", step, " comes before the last mapped step ",
                           last_step_, "; steps of an open vocabulary never go back");
  }
  if (num_keys < 0 || (num_keys > 0 && (keys == nullptr || rows == nullptr)) ||
      new_keys == nullptr || new_rows == nullptr || stats == nullptr) {
    return InvalidArgument(where_, ": bad key map arguments (", num_keys, " keys)");
  }
  *stats = KeyRowMapStepStats();
  new_keys->clear();
  new_rows->clear();
  // At most one admission per free row or per key: no reallocation while the step runs.
  const int64_t most_admissions = std::min(num_keys, config_.capacity);
  new_keys->reserve(most_admissions);
  new_rows->reserve(most_admissions);
  refused_.clear();
  deferred_.clear();
  waiting_.clear();
  wait_ = wait;
  last_step_ = step;
  const int32_t now = static_cast<int32_t>(step);
  // Slots are prefetched this many keys ahead: a map larger than the caches costs one miss per
  // key, and the misses of a window overlap.
  constexpr int64_t kAhead = 16;
  for (int64_t i = 0; i < num_keys; ++i) {
    if (i + kAhead < num_keys) {
      __builtin_prefetch(&slots_[MultiplyHigh(Mix64(keys[i + kAhead]), num_slots_)]);
    }
    const uint64_t key = keys[i];
    const int64_t slot = FindSlot(key);
    const int32_t held = slots_[slot].row;
    if (held != kNoRow) {
      if (!Expired(row_last_seen_[held], step)) {
        row_last_seen_[held] = now;
        rows[i] = held;
        continue;
      }
      TakeRowBack(held, stats);
    }
    bool deferred = false;
    rows[i] = CountMissedKey(key, held == kNoRow ? slot : kUnknownSlot, step, &deferred,
                             new_keys, new_rows, stats);
    if (deferred) {
      deferred_.push_back(i);
    } else if (rows[i] == kNoRow) {
      ++stats->unadmitted_ids;
    }
  }
  if (wait_) {
    // Each waiting key once, in the order the keys reached the threshold.
    std::unordered_set<uint64_t> seen;
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                  [&seen](uint64_t key) { return !seen.insert(key).second; }),
                   waiting_.end());
    stats->waiting_keys = static_cast<int64_t>(waiting_.size());
    return Status::Ok();
  }
  AnswerDeferred(keys, rows, stats);
  return Status::Ok();
}

// Occurrences counted before their key was admitted later in this step read its row too; then
// the refused keys are counted.
void KeyRowMap::AnswerDeferred(const uint64_t* keys, int32_t* rows, KeyRowMapStepStats* stats) {
  for (int64_t i : deferred_) {
    rows[i] = slots_[FindSlot(keys[i])].row;
    if (rows[i] == kNoRow) ++stats->unadmitted_ids;
  }
  deferred_.clear();
  std::sort(refused_.begin(), refused_.end());
  stats->refused_keys = std::unique(refused_.begin(), refused_.end()) - refused_.begin();
  refused_.clear();
}

int64_t KeyRowMap::FreeRows(KeyRowMapStepStats* stats) {
  if (config_.steps_to_live > 0 && last_step_ >= 0 && swept_step_ != last_step_ &&
      Expired(static_cast<int32_t>(oldest_last_seen_), last_step_)) {
    SweepExpiredRows(last_step_, stats);
  }
  return free_count_ + (config_.capacity - next_unused_);
}

void KeyRowMap::Unlist(int32_t row) {
  if (!reset_pending_[row]) return;
  reset_pending_[row] = false;
  const auto listed = std::find(rows_to_reset_.begin(), rows_to_reset_.end(), row);
  const auto at = listed - rows_to_reset_.begin();
  rows_to_reset_.erase(listed);
  keys_to_reset_.erase(keys_to_reset_.begin() + at);
}

Status KeyRowMap::LendRows(int64_t count, std::vector<int32_t>* rows) {
  KeyRowMapStepStats swept;
  const int64_t free = FreeRows(&swept);
  if (count < 0 || count > free || rows == nullptr) {
    return InvalidArgument(where_, ": cannot lend ", count, " rows; ", free, " are free");
  }
  rows->reserve(rows->size() + count);
  for (int64_t k = 0; k < count; ++k) {
    const int32_t row = TakeFreeRow(last_step_, &swept);
    rows->push_back(TableRow(row));
    Unlist(row);   // the borrower resets it for its own key
    row_slot_[row] = kNoRow;
    row_last_seen_[row] = -1;
    if (row >= config_.capacity) spare_lent_.push_back(row - static_cast<int32_t>(config_.capacity));
  }
  return Status::Ok();
}

Status KeyRowMap::ReserveKeys(int64_t keys) {
  const int64_t needed = SlotsFor(keys);
  if (needed <= num_slots_) return Status::Ok();
  std::vector<Slot> grown;
  try {
    grown.reserve(needed);
    BackWithHugePages(grown.data(), needed * static_cast<int64_t>(sizeof(Slot)));
    grown.assign(needed, Slot{0, 0, kNoRow});
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where_, ": cannot grow the key map to ", keys, " keys");
  }
  for (const Slot& s : slots_) {
    if (s.row == kNoRow) continue;
    int64_t slot = static_cast<int64_t>(MultiplyHigh(Mix64(KeyOf(s)), needed));
    while (grown[slot].row != kNoRow) {
      if (++slot == needed) slot = 0;
    }
    grown[slot] = s;
    row_slot_[s.row] = static_cast<int32_t>(slot);
  }
  slots_.swap(grown);
  num_slots_ = needed;
  return Status::Ok();
}

Status KeyRowMap::AddLentRows(const int32_t* lent, int64_t count) {
  if (count < 0 || (count > 0 && lent == nullptr)) {
    return InvalidArgument(where_, ": bad lent rows (", count, ")");
  }
  std::vector<int32_t> sorted(lent, lent + count);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t k = 0; k < count; ++k) {
    if (sorted[k] < 0 || sorted[k] >= TotalRows() || (k > 0 && sorted[k] == sorted[k - 1])) {
      return InvalidArgument(where_, ": lent row ", sorted[k], " is not a distinct row of the ",
                             TotalRows(), " rows of the table");
    }
  }
  const int64_t appended = std::max<int64_t>(0, count - static_cast<int64_t>(spare_lent_.size()));
  const int64_t rows = local_rows() + appended;
  if (rows > kMaxInt32) {
    return InvalidArgument(where_, ": ", rows, " rows are more than a map can number");
  }
  try {
    lent_.reserve(lent_.size() + appended);
    row_slot_.reserve(rows);
    row_last_seen_.reserve(rows);
    reset_pending_.reserve(rows);
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where_, ": cannot hold ", rows, " rows");
  }
  SCE_RETURN_IF_ERROR(ReserveKeys(rows));
  // Pushed last first: the free list gives them in the order lent.
  std::vector<int32_t> indices(count);
  for (int64_t k = 0; k < count; ++k) {
    int32_t index;
    if (!spare_lent_.empty()) {
      index = spare_lent_.back();
      spare_lent_.pop_back();
      lent_[index] = lent[k];
    } else {
      index = static_cast<int32_t>(lent_.size());
      lent_.push_back(lent[k]);
      row_slot_.push_back(kNoRow);
      row_last_seen_.push_back(-1);
      reset_pending_.push_back(false);
    }
    indices[k] = static_cast<int32_t>(config_.capacity) + index;
  }
  for (int64_t k = count - 1; k >= 0; --k) {
    row_slot_[indices[k]] = free_head_;
    free_head_ = indices[k];
    ++free_count_;
  }
  return Status::Ok();
}

Status KeyRowMap::FinishStep(const int32_t* lent, int64_t count, const uint64_t* keys,
                             int64_t num_keys, int32_t* rows, std::vector<uint64_t>* new_keys,
                             std::vector<int32_t>* new_rows, KeyRowMapStepStats* stats) {
  if (!wait_) {
    return InvalidArgument(where_, ": FinishStep without a waiting MapStep before it");
  }
  if (num_keys < 0 || (num_keys > 0 && (keys == nullptr || rows == nullptr)) ||
      new_keys == nullptr || new_rows == nullptr || stats == nullptr) {
    return InvalidArgument(where_, ": bad key map arguments (", num_keys, " keys)");
  }
  for (int64_t i : deferred_) {
    if (i >= num_keys) {
      return InvalidArgument(where_, ": FinishStep has ", num_keys,
                             " keys, fewer than its MapStep");
    }
  }
  SCE_RETURN_IF_ERROR(AddLentRows(lent, count));
  *stats = KeyRowMapStepStats();
  wait_ = false;
  for (uint64_t key : waiting_) {
    const int32_t row = Admit(key, kUnknownSlot, last_step_, new_keys, new_rows, stats);
    if (row != kNoRow && config_.admission_threshold > 1) {
      const int64_t slot = FindPendingSlot(key);
      if (pending_[slot].count != 0) ErasePendingSlot(slot);
    }
  }
  waiting_.clear();
  AnswerDeferred(keys, rows, stats);
  return Status::Ok();
}


Status KeyRowMap::NumberStepRows(const int32_t* rows, int64_t n, int32_t* positions,
                                 std::vector<int32_t>* unique_rows) {
  if (n < 0 || (n > 0 && (rows == nullptr || positions == nullptr)) || unique_rows == nullptr) {
    return InvalidArgument(where_, ": bad row numbering arguments (", n, " rows)");
  }
  SCE_RETURN_IF_ERROR(CheckInRange(where_, "the rows to number", n, 0, kMaxInt32 - 2));
  unique_rows->clear();
  // Room for every distinct row first: nothing allocates while rows hold their numbers.
  try {
    unique_rows->reserve(std::min<int64_t>(n, config_.capacity) + 1);
  } catch (const std::bad_alloc&) {
    return InvalidArgument(where_, ": cannot allocate the numbering of ", n, " rows");
  }
  const int32_t now = static_cast<int32_t>(last_step_);
  // Before any step no row was given (every row's -1 would read as the step -1).
  const uint32_t capacity = last_step_ >= 0 ? static_cast<uint32_t>(local_rows()) : 0;
  // While numbering, the last-seen step of a row numbered k (= now before) holds -(k + 2): every
  // such value is <= -2, and -1 marks free rows, so neither is taken for a step.
  int32_t no_row = -1;   // the number of kNoRow, once it occurs
  // The rows come in batch order, so their metadata is read at random: prefetched some rows
  // ahead (the map's step has just brought most of it to the caches).
  constexpr int64_t kAhead = 16;
  int64_t i = 0;
  for (; i < n; ++i) {
    if (i + kAhead < n) {
      const uint32_t ahead = static_cast<uint32_t>(rows[i + kAhead]);
      if (ahead < capacity) __builtin_prefetch(&row_last_seen_[ahead], 1);
    }
    const int32_t row = rows[i];
    if (static_cast<uint32_t>(row) >= capacity) {
      if (row != kNoRow) break;
      if (no_row < 0) {
        no_row = static_cast<int32_t>(unique_rows->size());
        unique_rows->push_back(kNoRow);
      }
      positions[i] = no_row;
      continue;
    }
    int32_t& seen = row_last_seen_[row];
    if (seen <= -2) {
      positions[i] = -(seen + 2);
    } else if (seen == now) {
      positions[i] = static_cast<int32_t>(unique_rows->size());
      seen = -static_cast<int32_t>(unique_rows->size()) - 2;
      unique_rows->push_back(row);
    } else {
      break;   // not given in the last step
    }
  }
  // Every numbered row was seen now: its last-seen step comes back.
  for (int32_t row : *unique_rows) {
    if (row != kNoRow) row_last_seen_[row] = now;
  }
  if (i < n) {
    const int32_t row = rows[i];
    unique_rows->clear();
    if (row < kNoRow || row >= local_rows()) {
      return InvalidArgument(where_, ": rows[", i, "] = ", row, " is not a row of this map (",
                             local_rows(), " rows)");
    }
    if (last_step_ < 0) {
      return InvalidArgument(where_, ": rows[", i, "] = ", row,
                             " was not given: the map has mapped no step yet");
    }
    return InvalidArgument(where_, ": rows[", i, "] = ", row, " was not given in step ",
                           last_step_, ", the map's last step");
  }
  return Status::Ok();
}

void KeyRowMap::ConfirmReset(int64_t count) {
  const int64_t n = std::clamp<int64_t>(count, 0, static_cast<int64_t>(rows_to_reset_.size()));
  for (int64_t i = 0; i < n; ++i) reset_pending_[rows_to_reset_[i]] = false;
  rows_to_reset_.erase(rows_to_reset_.begin(), rows_to_reset_.begin() + n);
  keys_to_reset_.erase(keys_to_reset_.begin(), keys_to_reset_.begin() + n);
}

void KeyRowMap::Find(const uint64_t* keys, int64_t num_keys, int32_t* rows) const {
  for (int64_t i = 0; i < num_keys; ++i) {
    const int32_t row = slots_[FindSlot(keys[i])].row;
    rows[i] = row != kNoRow && !Expired(row_last_seen_[row], last_step_) ? row : kNoRow;
  }
}

// ---- Logical state -------------------------------------------------------------------------

KeyRowMapState KeyRowMap::Export() const {
  KeyRowMapState state;
  state.last_step = last_step_;
  std::vector<std::pair<uint64_t, int32_t>> held;  // (key, row)
  for (int64_t row = 0; row < local_rows(); ++row) {
    if (row == next_unused_) row = config_.capacity;   // own rows never used
    if (row == local_rows()) break;
    const int32_t last_seen = row_last_seen_[row];
    if (last_seen < 0 || Expired(last_seen, last_step_)) continue;
    held.emplace_back(KeyOf(slots_[row_slot_[row]]), static_cast<int32_t>(row));
  }
  std::sort(held.begin(), held.end(),
            [](const auto& a, const auto& b) { return KeyLess(a.first, b.first); });
  for (const auto& [key, row] : held) {
    state.keys.push_back(key);
    state.rows.push_back(row);
    state.last_seen.push_back(row_last_seen_[row]);
  }
  std::vector<PendingSlot> pending;
  for (const PendingSlot& s : pending_) {
    if (s.count != 0) pending.push_back(s);
  }
  std::sort(pending.begin(), pending.end(),
            [](const PendingSlot& a, const PendingSlot& b) { return KeyLess(a.key, b.key); });
  for (const PendingSlot& s : pending) {
    state.pending_keys.push_back(s.key);
    state.pending_counts.push_back(s.count);
    state.pending_last_seen.push_back(s.last_seen);
  }
  return state;
}

Status KeyRowMap::Import(const KeyRowMapState& state, const KeyRowMapPlacement* placement) {
  const int64_t n = static_cast<int64_t>(state.keys.size());
  const int64_t p = static_cast<int64_t>(state.pending_keys.size());
  SCE_RETURN_IF_ERROR(CheckInRange(where_, "last_step", state.last_step, -1, kMaxKeyRowMapStep));
  const bool placed = placement != nullptr;
  static const std::vector<int32_t> kNone;
  const std::vector<int32_t>& rows = placed ? placement->rows : kNone;
  const std::vector<int32_t>& lent_rows = placed ? placement->lent_rows : kNone;
  if (placed && static_cast<int64_t>(rows.size()) != n) {
    return InvalidArgument(where_, ": the placement has ", rows.size(), " rows for ", n, " keys");
  }
  if (n > (placed ? TotalRows() : config_.capacity)) {
    return InvalidArgument(where_, ": the saved state holds ", n,
                           " keys, more than the capacity of ",
                           placed ? TotalRows() : config_.capacity, " rows");
  }
  // With rows: each own row used once at most (by a key of this map or as lent), and every
  // other row once at most.
  std::vector<uint8_t> own_used;
  std::vector<int32_t> others;
  if (placed) {
    own_used.assign(config_.capacity, 0);
    const auto use = [&](int32_t row, bool lent) -> Status {
      if (row < 0 || row >= TotalRows()) {
        return InvalidArgument(where_, ": saved row ", row, " is outside the ", TotalRows(),
                               " rows of the table");
      }
      const int64_t own = row - config_.first_row;
      if (own >= 0 && own < config_.capacity) {
        if (own_used[own]++) return InvalidArgument(where_, ": saved row ", row, " is given twice");
      } else if (lent) {
        return InvalidArgument(where_, ": lent row ", row, " is not a row of this map");
      } else {
        others.push_back(row);
      }
      return Status::Ok();
    };
    for (int32_t row : rows) SCE_RETURN_IF_ERROR(use(row, false));
    for (int32_t row : lent_rows) SCE_RETURN_IF_ERROR(use(row, true));
    std::vector<int32_t> sorted = others;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgument(where_, ": a saved row of another shard is given twice");
    }
  }
  if (state.last_seen.size() != state.keys.size() ||
      state.pending_counts.size() != state.pending_keys.size() ||
      state.pending_last_seen.size() != state.pending_keys.size()) {
    return InvalidArgument(where_, ": the saved keys, counts and last-seen steps differ in size");
  }
  if (p > 0 && config_.admission_threshold == 1) {
    return InvalidArgument(where_, ": the saved state has ", p,
                           " pending keys, but an admission_threshold of 1 keeps none");
  }
  if (p > config_.pending_capacity) {
    return InvalidArgument(where_, ": the saved state has ", p,
                           " pending keys, more than the pending_capacity of ",
                           config_.pending_capacity);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && !KeyLess(state.keys[i - 1], state.keys[i])) {
      return InvalidArgument(where_, ": saved keys must be strictly ascending (entry ", i, ")");
    }
    if (state.last_seen[i] < 0 || state.last_seen[i] > state.last_step) {
      return InvalidArgument(where_, ": saved last-seen step ", state.last_seen[i],
                             " is outside [0, ", state.last_step, "] (entry ", i, ")");
    }
  }
  for (int64_t i = 0; i < p; ++i) {
    if (i > 0 && !KeyLess(state.pending_keys[i - 1], state.pending_keys[i])) {
      return InvalidArgument(where_, ": saved pending keys must be strictly ascending (entry ", i,
                             ")");
    }
    if (state.pending_counts[i] < 1) {
      return InvalidArgument(where_, ": saved pending count ", state.pending_counts[i],
                             " must be >= 1 (entry ", i, ")");
    }
    if (state.pending_last_seen[i] < 0 || state.pending_last_seen[i] > state.last_step) {
      return InvalidArgument(where_, ": saved pending last-seen step ",
                             state.pending_last_seen[i], " is outside [0, ", state.last_step,
                             "] (entry ", i, ")");
    }
    if (std::binary_search(state.keys.begin(), state.keys.end(), state.pending_keys[i],
                           KeyLess)) {
      return InvalidArgument(where_, ": saved key ", static_cast<int64_t>(state.pending_keys[i]),
                             " is both held and pending");
    }
  }
  if (config_.capacity + static_cast<int64_t>(others.size()) > kMaxInt32) {
    return InvalidArgument(where_, ": ", others.size(), " lent rows are more than a map holds");
  }
  SCE_RETURN_IF_ERROR(ReserveKeys(config_.capacity + static_cast<int64_t>(others.size())));
  ClearAll();
  if (placed && !others.empty()) {
    // Rows of other shards: lent rows of this map, in the order the keys hold them.
    std::vector<int32_t> in_order;
    for (int32_t row : rows) {
      const int64_t own = row - config_.first_row;
      if (own < 0 || own >= config_.capacity) in_order.push_back(row);
    }
    SCE_RETURN_IF_ERROR(AddLentRows(in_order.data(), static_cast<int64_t>(in_order.size())));
    free_head_ = kNoRow;   // every one is held below
    free_count_ = 0;
  }
  last_step_ = state.last_step;
  int64_t oldest = std::max<int64_t>(state.last_step, 0);
  int64_t next_lent = config_.capacity;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = state.keys[i];
    const int64_t slot = FindSlot(key);
    int32_t row = static_cast<int32_t>(i);
    if (placed) {
      const int64_t own = rows[i] - config_.first_row;
      row = static_cast<int32_t>(own >= 0 && own < config_.capacity ? own : next_lent++);
    }
    slots_[slot] = Slot{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), row};
    row_slot_[row] = static_cast<int32_t>(slot);
    row_last_seen_[row] = state.last_seen[i];
    oldest = std::min<int64_t>(oldest, state.last_seen[i]);
  }
  next_unused_ = placed ? config_.capacity : n;
  if (placed) {
    // Own rows neither held nor lent are free, lowest first.
    for (int64_t row = config_.capacity - 1; row >= 0; --row) {
      if (own_used[row]) continue;
      row_slot_[row] = free_head_;
      free_head_ = static_cast<int32_t>(row);
      ++free_count_;
    }
  }
  size_ = n;
  oldest_last_seen_ = oldest;
  for (int64_t i = 0; i < p; ++i) {
    pending_[FindPendingSlot(state.pending_keys[i])] =
        PendingSlot{state.pending_keys[i], state.pending_counts[i], state.pending_last_seen[i]};
  }
  pending_size_ = p;
  return Status::Ok();
}

}  // namespace sce
