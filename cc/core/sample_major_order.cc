#include "cc/core/sample_major_order.h"

#include <algorithm>
#include <limits>
#include <new>

#include "cc/core/constants.h"

namespace sce {

bool SampleMajorOrder::Fits(const CsrView& view) {
  return view.table_rows <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
}

namespace {

// Calls visit(sample, table row, gain) for every valid entry of source SparseCore `sc`, in the
// order the lookup's buffer-order loop adds them.
template <typename Visit>
void ForEachValidEntry(const CsrView& view, int64_t sc, Visit&& visit) {
  const int64_t rows_per_shard = view.rows_per_shard();
  for (int64_t b = 0; b < view.num_minibatches; ++b) {
    for (int64_t p = 0; p < view.local_shards(); ++p) {
      int64_t begin, end;
      view.Segment(sc, b, view.first_local_shard + p, &begin, &end);
      const int64_t shard_origin = p * rows_per_shard;
      for (int64_t i = begin; i < end; ++i) {
        const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
        if (token == kPad || sample == kPad) continue;
        visit(sample, shard_origin + token, view.gains[i]);
      }
    }
  }
}

}  // namespace

SampleMajorOrder& SampleMajorOrder::ForThisThread() {
  static thread_local SampleMajorOrder order;
  return order;
}

bool SampleMajorOrder::Build(const CsrView& view, int64_t sc) {
  // A counting sort: count each sample's entries into the slot after its own, turn the counts
  // into offsets, place each entry at its sample's next free slot (advancing that sample's
  // offset to where the next sample starts; stable, so each sample keeps the visiting order),
  // then shift the offsets back by one slot.
  const int64_t samples = view.samples_per_sc();
  try {
    sample_begin_.assign(samples + 1, 0);
  } catch (const std::bad_alloc&) {
    return false;
  }
  ForEachValidEntry(view, sc, [&](int32_t sample, int64_t, float) { ++sample_begin_[sample + 1]; });
  for (int64_t i = 0; i < samples; ++i) sample_begin_[i + 1] += sample_begin_[i];
  const size_t total = static_cast<size_t>(sample_begin_[samples]);
  // Grow only: resize would value-initialize (write) every new entry, and a shrink frees nothing.
  if (entries_.size() < total) {
    try {
      entries_.resize(total);
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  ForEachValidEntry(view, sc, [&](int32_t sample, int64_t row, float gain) {
    entries_[sample_begin_[sample]++] = {static_cast<uint32_t>(row), gain};
  });
  std::copy_backward(sample_begin_.begin(), sample_begin_.end() - 1, sample_begin_.end());
  sample_begin_[0] = 0;
  return true;
}

}  // namespace sce
