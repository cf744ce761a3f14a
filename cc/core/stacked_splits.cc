#include "cc/core/stacked_splits.h"

#include <algorithm>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"

namespace sce {
namespace {

// One piece's ids as sort words: the stacking transform of each col (rotation inside the shard
// bits, then the member table's offset) and the row shift into the SparseCore's block, with
// positions from `first_position` on; gains copied alongside. Returns whether a stacked col falls
// outside [0, limit). Branch-free, so that it vectorizes; compiled for AVX-512, AVX2 and the
// baseline, chosen at run time.
__attribute__((target_clones("avx512f", "avx2", "default"))) bool PackStackedWords(
    const int32_t* rows, const int32_t* cols, const float* gains, int64_t count,
    int32_t row_shift, int64_t mask, int64_t shift, int64_t offset, int64_t limit,
    const SortWordFormat format, uint64_t first_position, uint64_t* words, float* out_gains) {
  uint64_t bad = 0;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t col = cols[j];
    const uint64_t new_col =
        static_cast<uint64_t>(((col + shift) & mask) + (col & ~mask) + offset);
    bad |= new_col >= static_cast<uint64_t>(limit);
    words[j] = format.Pack(new_col, static_cast<uint64_t>(rows[j] + row_shift),
                           first_position + static_cast<uint64_t>(j));
    out_gains[j] = gains[j];
  }
  return bad != 0;
}

// The features' merged entries as the splits engine reads them: SparseCore s's ids are the
// pieces (s, feature 0), (s, feature 1), ... of StackedCooParts, in that order, each mapped by its
// feature's stacking transform as it is read.
class StackedFeaturesSource : public SplitsIdSource {
 public:
  StackedFeaturesSource(const std::vector<StackedFeature>& features,
                        const StackedCooParts& parts, const MinibatchSplitsParams& params)
      : features_(features), parts_(parts), params_(params),
        num_features_(static_cast<int64_t>(features.size())),
        per_sc_(params.sample_count / params.num_sc_per_chip) {}

  int64_t Count(int64_t s) const override {
    const int64_t first = s * num_features_, last = first + num_features_ - 1;
    return parts_.offsets[last] + (parts_.end[last] - parts_.begin[last]) -
           parts_.offsets[first];
  }

  // Every stacked col is checked to be below the stacked table's rows as it is read.
  int32_t MaxCol(int64_t /*s*/) const override {
    return static_cast<int32_t>(std::min<int64_t>(params_.table_vocab_size - 1, kMaxInt32));
  }

  // The row of an entry of piece (s, f) inside SparseCore s's block of the stacked batch.
  int64_t LocalRowShift(int64_t s, int64_t f) const {
    const StackingTransform& t = features_[f].transform;
    const int64_t feature_per_sc = features_[f].sample_count / parts_.num_sc;
    return t.row_offset / parts_.num_sc + (per_sc_ - feature_per_sc) * s - per_sc_ * s;
  }

  // Rows sorted across the pieces of every SparseCore and inside its block, as the
  // minibatch-splits op requires of its input.
  Status CheckRows() const {
    for (int64_t s = 0; s < parts_.num_sc; ++s) {
      int64_t previous = 0;
      for (int64_t f = 0; f < num_features_; ++f) {
        const int64_t k = s * num_features_ + f;
        if (parts_.begin[k] == parts_.end[k]) continue;
        const std::vector<int32_t>& rows = parts_.per_feature[f].rows;
        const int64_t shift = LocalRowShift(s, f);
        const int64_t first = rows[parts_.begin[k]] + shift;
        const int64_t last = rows[parts_.end[k] - 1] + shift;
        if (first < previous || last >= per_sc_) {
          return InvalidArgument(features_[f].context.Describe(), ": on sparse core ", s,
                                 " its rows [", first, ", ", last,
                                 "] of the stacked table's block overlap the previous feature's "
                                 "(which end at ", previous, ") or leave the block of ", per_sc_,
                                 " rows");
        }
        previous = last;
      }
    }
    return Status::Ok();
  }

  Status Fill(int64_t s, const SortWordFormat& format, uint64_t* words, float* gain_scratch,
              int32_t* row_scratch, const float** gains) const override {
    // Copied into locals (and the loop's bounds below too): the stores into the buffers would
    // otherwise make the compiler reload every field of the format for every id.
    const SortWordFormat f = format;
    // Stacked cols must be below the stacked table's rows (and so fit in int32).
    const int64_t limit = std::min<int64_t>(params_.table_vocab_size, int64_t{kMaxInt32} + 1);
    int64_t at = 0;
    for (int64_t feature = 0; feature < num_features_; ++feature) {
      const int64_t k = s * num_features_ + feature;
      const StackingTransform& t = features_[feature].transform;
      const CooEntries& e = parts_.per_feature[feature];
      const int64_t begin = parts_.begin[k], count = parts_.end[k] - begin;
      const int32_t* rows = e.rows.data() + begin;
      const int32_t* cols = e.cols.data() + begin;
      const float* feature_gains = e.gains.data() + begin;
      const int32_t row_shift = static_cast<int32_t>(LocalRowShift(s, feature));
      const int64_t mask = t.num_sc_shards - 1, shift = t.col_shift, offset = t.col_offset;
      // Out-of-range cols are only flagged here and located afterwards.
      const bool bad = PackStackedWords(rows, cols, feature_gains, count, row_shift, mask, shift,
                                        offset, limit, f, static_cast<uint64_t>(at), words + at,
                                        gain_scratch + at);
      if (!f.rows_in_words) {
        for (int64_t j = 0; j < count; ++j) row_scratch[at + j] = rows[j] + row_shift;
      }
      if (bad) {
        for (int64_t j = 0; j < count; ++j) {
          const int64_t col = cols[j];
          const int64_t new_col = ((col + shift) & mask) + (col & ~mask) + offset;
          if (new_col < 0 || new_col >= limit) {
            return InvalidArgument(features_[feature].context.Describe(), ": id ", col,
                                   " maps to stacked column ", new_col, " outside the rows [0, ",
                                   limit, ") of stacked table '", params_.table_name, "'");
          }
        }
      }
      at += count;
    }
    *gains = gain_scratch;
    return Status::Ok();
  }

 private:
  const std::vector<StackedFeature>& features_;
  const StackedCooParts& parts_;
  const MinibatchSplitsParams& params_;
  const int64_t num_features_;
  const int64_t per_sc_;
};

}  // namespace

Status GetStackedMinibatchSplits(const std::vector<StackedFeature>& features,
                                 const MinibatchSplitsParams& params, MinibatchSplits* out,
                                 const ParallelFor& parallel_for,
                                 const SplitIdAllocator& allocate) {
  SCE_RETURN_IF_ERROR(ValidateMinibatchSplitsParams(params));
  for (const StackedFeature& f : features) {
    if (f.transform.stacked_table_sample_count != params.sample_count ||
        f.transform.num_sc_per_chip != params.num_sc_per_chip) {
      return InvalidArgument(f.context.Describe(), ": stacked_table_sample_count (",
                             f.transform.stacked_table_sample_count, ") and num_sc_per_chip (",
                             f.transform.num_sc_per_chip, ") must equal the stacked table '",
                             params.table_name, "''s sample_count (", params.sample_count,
                             ") and num_sc_per_chip (", params.num_sc_per_chip, ")");
    }
  }
  StackedCooParts parts;
  SCE_RETURN_IF_ERROR(ConvertFeaturesToStackedCoo(features, parallel_for, &parts));
  const StackedFeaturesSource source(features, parts, params);
  SCE_RETURN_IF_ERROR(source.CheckRows());
  return GetMinibatchSplitsFrom(source, params, out, parallel_for, allocate);
}

}  // namespace sce
