#include "cc/core/stacked_coo.h"

#include <algorithm>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"

namespace sce {
Status ConvertFeaturesToStackedCoo(const std::vector<StackedFeature>& features,
                                   const ParallelFor& parallel_for, StackedCooParts* parts) {
  const int64_t num_features = static_cast<int64_t>(features.size());
  if (num_features == 0) return InvalidArgument("stacked COO conversion: no features");
  for (const StackedFeature& f : features) SCE_RETURN_IF_ERROR(ValidateStackingTransform(f.transform, f.sample_count, f.context));
  const int64_t sc = features[0].transform.num_sc_per_chip;
  for (const StackedFeature& f : features) {
    if (f.transform.num_sc_per_chip != sc) {
      return InvalidArgument(f.context.Describe(), ": num_sc_per_chip (",
                             f.transform.num_sc_per_chip,
                             ") differs from the other features of the stacked table (", sc, ")");
    }
  }
  int64_t slots;
  SCE_RETURN_IF_ERROR(CheckedSize(features[0].context.Describe(), "num_sc_per_chip * features",
                                  {sc, num_features}, kMaxAllocationElements, &slots));
  parts->num_sc = sc;
  parts->per_feature.assign(num_features, CooEntries());
  parts->begin.assign(slots, 0);
  parts->end.assign(slots, 0);
  std::vector<Status> status(num_features);
  // One unit per feature; the cost hint only needs to make every feature its own unit.
  parallel_for(num_features, int64_t{1} << 20, [&](int64_t first, int64_t last) {
    for (int64_t f = first; f < last; ++f) {
      const StackedFeature& x = features[f];
      status[f] = ConvertToCoo(x.input, x.sample_count, x.combiner, x.vocabulary_size, x.context,
                               &parts->per_feature[f]);
      if (!status[f].ok()) continue;
      // Rows are non-decreasing sample ids: SC i's entries are those with rows in
      // [i * B_sc, (i + 1) * B_sc), found by binary search instead of a division per entry.
      const std::vector<int32_t>& rows = parts->per_feature[f].rows;
      const int64_t per_sc = x.sample_count / sc;
      auto cursor = rows.begin();
      for (int64_t i = 0; i < sc; ++i) {
        auto stop = std::lower_bound(cursor, rows.end(), (i + 1) * per_sc,
                                     [](int32_t row, int64_t bound) { return row < bound; });
        parts->begin[i * num_features + f] = cursor - rows.begin();
        parts->end[i * num_features + f] = stop - rows.begin();
        cursor = stop;
      }
    }
  });
  for (const Status& s : status) SCE_RETURN_IF_ERROR(s);

  parts->offsets.assign(slots, 0);
  int64_t total = 0;
  for (int64_t k = 0; k < slots; ++k) {
    parts->offsets[k] = total;
    if (!CheckedAdd(total, parts->end[k] - parts->begin[k], &total) || total > kMaxInt32) {
      return InvalidArgument(features[k % num_features].context.Describe(),
                             ": the stacked table's features hold more than ", kMaxInt32,
                             " ids in all, which does not fit the int32 buffer formats");
    }
  }
  parts->total = total;
  return Status::Ok();
}

Status WriteStackedCoo(const std::vector<StackedFeature>& features, const StackedCooParts& parts,
                       int32_t* rows, int32_t* cols, float* gains,
                       const ParallelFor& parallel_for) {
  const int64_t num_features = static_cast<int64_t>(parts.per_feature.size());
  const int64_t slots = static_cast<int64_t>(parts.offsets.size());
  if (num_features == 0 || slots == 0) return Status::Ok();
  std::vector<Status> status(slots);
  const int64_t per_slot = parts.total / slots + 1;
  parallel_for(slots, 16 * per_slot, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      const int64_t f = k % num_features, i = k / num_features;
      const StackedFeature& x = features[f];
      const StackingTransform& t = x.transform;
      const CooEntries& e = parts.per_feature[f];
      const int64_t per_sc = x.sample_count / parts.num_sc;
      // Row r of SC i: r - i * B_sc within the SC, placed after the features before this one
      // (row_offset / S) in SC i's block of the stacked batch.
      const int64_t row_shift = t.row_offset / parts.num_sc +
                                (t.stacked_table_sample_count / parts.num_sc - per_sc) * i;
      const int64_t mask = t.num_sc_shards - 1;
      int64_t at = parts.offsets[k];
      for (int64_t j = parts.begin[k]; j < parts.end[k]; ++j, ++at) {
        const int64_t col = e.cols[j];
        const int64_t new_col = ((col + t.col_shift) & mask) + (col & ~mask) + t.col_offset;
        if (new_col < 0 || new_col > kMaxInt32) {
          status[k] = InvalidArgument(x.context.Describe(), ": id ", col, " maps to stacked column ",
                                      new_col, " which does not fit in int32");
          break;
        }
        rows[at] = static_cast<int32_t>(e.rows[j] + row_shift);
        cols[at] = static_cast<int32_t>(new_col);
        gains[at] = e.gains[j];
      }
    }
  });
  // The first failing feature in input order (then SparseCore order), as ConvertToListOfCoo would
  // report it for that feature.
  for (int64_t f = 0; f < num_features; ++f) {
    for (int64_t i = 0; i < parts.num_sc; ++i) SCE_RETURN_IF_ERROR(status[i * num_features + f]);
  }
  return Status::Ok();
}

}  // namespace sce
