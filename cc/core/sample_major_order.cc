#include "cc/core/sample_major_order.h"

#include <algorithm>
#include <limits>
#include <new>

#include "cc/core/constants.h"

namespace sce {

bool SampleMajorOrder::Fits(const CsrView& view) {
  return view.table_rows <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max());
}

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
  // (Both are checked: if the second resize failed, the first one's may have grown alone.)
  if (rows_.size() < total || gains_.size() < total) {
    try {
      if (rows_.size() < total) rows_.resize(total);
      if (gains_.size() < total) gains_.resize(total);
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  ForEachValidEntry(view, sc, [&](int32_t sample, int64_t row, float gain) {
    const int32_t slot = sample_begin_[sample]++;
    rows_[slot] = static_cast<uint32_t>(row);
    gains_[slot] = gain;
  });
  std::copy_backward(sample_begin_.begin(), sample_begin_.end() - 1, sample_begin_.end());
  sample_begin_[0] = 0;
  return true;
}

}  // namespace sce
