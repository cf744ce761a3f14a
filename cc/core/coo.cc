#include "cc/core/coo.h"

#include <algorithm>
#include <cmath>

#include "cc/core/adjacent_merge.h"
#include "cc/core/checked_math.h"
#include "cc/core/constants.h"

namespace sce {

Status ParseCombiner(const std::string& name, Combiner* combiner) {
  if (name == "sum") {
    *combiner = Combiner::kSum;
  } else if (name == "mean") {
    *combiner = Combiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = Combiner::kSqrtn;
  } else {
    return InvalidArgument("combiner must be one of 'sum', 'mean' or 'sqrtn', got '", name, "'");
  }
  return Status::Ok();
}

std::string Context::Describe() const {
  std::string text = "table '" + (table.empty() ? std::string("<unnamed>") : table) + "'";
  if (!feature.empty()) text += ", feature '" + feature + "'";
  return text;
}

namespace {

// Checks the input's form (docs/preprocessing.md#input-forms): ranks, sizes, and that the sample
// of every id is known and non-decreasing (row_splits non-decreasing; SparseTensor rows sorted
// and below sample_count).
Status ValidateIdInput(const IdInput& in, int64_t sample_count, const Context& ctx) {
  const std::string where = ctx.Describe();
  if (in.values_rank != 1) {
    return InvalidArgument(where, ": values must be rank 1, got rank ", in.values_rank);
  }
  if (in.weights_rank > 1) {
    return InvalidArgument(where, ": weights must be a scalar or rank 1, got rank ",
                           in.weights_rank);
  }
  if (in.weights_rank == 1 && in.num_weights != in.num_values) {
    return InvalidArgument(where, ": weights has ", in.num_weights, " elements but values has ",
                           in.num_values);
  }
  if (sample_count < 1 || sample_count > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(where, ": sample_count must be in [1, 2^31), got ", sample_count);
  }
  const int64_t n = in.num_values;
  if (in.index_rank == 1 && in.index_dim0 == 0) {  // dense: one id per sample
    if (n != 0 && n != sample_count) {
      return InvalidArgument(where, ": dense input has ", n, " ids but sample_count is ",
                             sample_count);
    }
    return Status::Ok();
  }
  if (in.index_rank == 1) {  // ragged row_splits
    const int32_t* splits = in.index_data;
    if (in.index_dim0 != sample_count + 1) {
      return InvalidArgument(where, ": row_splits has ", in.index_dim0,
                             " elements but sample_count + 1 = ", sample_count + 1);
    }
    if (splits[0] != 0) {
      return InvalidArgument(where, ": row_splits must start at 0, got ", splits[0]);
    }
    for (int64_t r = 0; r < sample_count; ++r) {
      if (splits[r + 1] < splits[r]) {
        return InvalidArgument(where, ": row_splits must be non-decreasing, but row_splits[", r + 1,
                               "] = ", splits[r + 1], " < row_splits[", r, "] = ", splits[r]);
      }
    }
    if (splits[sample_count] != n) {
      return InvalidArgument(where, ": row_splits ends at ", splits[sample_count],
                             " but values has ", n, " elements");
    }
    return Status::Ok();
  }
  if (in.index_rank == 2) {  // SparseTensor indices [n, 2]
    if (in.index_dim0 != n) {
      return InvalidArgument(where, ": sparse indices has ", in.index_dim0, " rows but values has ",
                             n, " elements");
    }
    if (n == 0) return Status::Ok();
    if (in.index_dim1 != 2) {
      return InvalidArgument(where, ": sparse indices must have 2 columns (rank-2 SparseTensor), got ",
                             in.index_dim1);
    }
    int32_t previous = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t row = in.index_data[2 * i];
      if (row < previous) {
        return InvalidArgument(where,
                               ": indices of SparseTensor need to be sorted in ascending "
                               "(non-decreasing) order; row ",
                               row, " at position ", i, " follows row ", previous);
      }
      if (row >= sample_count) {
        return InvalidArgument(where, ": sparse index row ", row, " at position ", i,
                               " is not below sample_count ", sample_count);
      }
      previous = row;
    }
    return Status::Ok();
  }
  return InvalidArgument(where, ": invalid indices_or_row_splits of rank ", in.index_rank,
                         "; expected rank 1 (row_splits, or empty for dense) or rank 2 (sparse)");
}

// Calls run(row, begin, end) for each sample with ids, in order: its ids are [begin, end) (all
// three input forms keep a sample's ids contiguous). `in` must have passed ValidateIdInput.
template <typename RunFn>
void ForEachSampleRun(const IdInput& in, RunFn run) {
  const int64_t n = in.num_values;
  if (in.index_rank == 1 && in.index_dim0 == 0) {  // dense: one id per sample
    for (int64_t i = 0; i < n; ++i) run(static_cast<int32_t>(i), i, i + 1);
  } else if (in.index_rank == 1) {  // ragged row_splits
    for (int64_t r = 0; r + 1 < in.index_dim0; ++r) {
      if (in.index_data[r] < in.index_data[r + 1]) {
        run(static_cast<int32_t>(r), in.index_data[r], in.index_data[r + 1]);
      }
    }
  } else {  // SparseTensor indices [n, 2], rows sorted
    for (int64_t i = 0; i < n;) {
      const int32_t row = in.index_data[2 * i];
      int64_t end = i + 1;
      while (end < n && in.index_data[2 * end] == row) ++end;
      run(row, i, end);
      i = end;
    }
  }
}

Status CheckIds(const IdInput& in, int64_t vocabulary_size, const Context& ctx) {
  for (int64_t i = 0; i < in.num_values; ++i) {
    const int32_t id = in.values[i];
    if (id < 0 || (vocabulary_size >= 0 && id >= vocabulary_size)) {
      if (vocabulary_size >= 0) {
        return InvalidArgument(ctx.Describe(), ": id ", id, " at position ", i,
                               " is out of range [0, ", vocabulary_size, ")");
      }
      return InvalidArgument(ctx.Describe(), ": id ", id, " at position ", i, " is negative");
    }
  }
  return Status::Ok();
}

// Normalisation factor of the combiner (docs/preprocessing.md#combiners) for a row whose weights sum (mean) or sum of
// squares (sqrtn) is `s`; a row whose sum is 0 gets 0.
inline float CombinerFactor(float s, Combiner combiner) {
  if (s == 0.0f) return 0.0f;
  return combiner == Combiner::kMean ? static_cast<float>(1.0 / static_cast<double>(s))
                                     : static_cast<float>(1.0 / static_cast<double>(std::sqrt(s)));
}

// The sample of every id, written to rows[0, n): for ragged input, from row_splits without a
// loop per sample (whose varying trip counts mispredict at about one branch per sample): a sample
// ending at position e < n adds 1 at rows[e], and the running sum is then each id's sample.
// `rows` must be zero on entry; `in` must have passed ValidateIdInput.
void SampleOfEveryId(const IdInput& in, int32_t* rows) {
  const int64_t n = in.num_values;
  if (in.index_rank == 1 && in.index_dim0 == 0) {  // dense: one id per sample
    for (int64_t i = 0; i < n; ++i) rows[i] = static_cast<int32_t>(i);
  } else if (in.index_rank == 1) {  // ragged row_splits, non-decreasing, ending at n
    const int32_t* splits = in.index_data;
    for (int64_t r = 0; r + 1 < in.index_dim0 && splits[r + 1] < n; ++r) ++rows[splits[r + 1]];
    PrefixSumInPlace(rows, n);
  } else {  // SparseTensor indices [n, 2]
    for (int64_t i = 0; i < n; ++i) rows[i] = in.index_data[2 * i];
  }
}

// The merged entries of every combiner (adjacent_merge.h, once each id's sample is known); mean
// and sqrtn then scale them (ScaleByCombiner). rows / cols / gains hold num_values entries, rows
// zeros. Also flags in *bad whether an id is negative or not below
// `vocabulary_size` (when >= 0): this pass reads every id anyway, so CheckIds only runs to name
// the first bad one.
int64_t MergeEntries(const IdInput& in, int64_t vocabulary_size, int32_t* rows, int32_t* cols,
                        float* gains, bool* bad) {
  SampleOfEveryId(in, rows);
  // Ids are int32, so no bound needs to exceed 2^31.
  const uint32_t bound = static_cast<uint32_t>(
      vocabulary_size >= 0 ? std::min<int64_t>(vocabulary_size, int64_t{1} << 31)
                           : int64_t{1} << 31);
  return MergeAdjacentDuplicates(in.values, in.weights, in.weights_rank == 1, in.num_values,
                                 bound, rows, cols, gains, bad);
}

// Mean and sqrtn: scales the merged entries [0, count) of every sample (they are grouped by
// sample, in input order) by the combiner factor of all the sample's ids' weights, summed in
// input order before any merging (CombinerFactor).
void ScaleByCombiner(const IdInput& in, Combiner combiner, int64_t count, const int32_t* rows,
                     float* gains) {
  const bool per_id = in.weights_rank == 1;
  int64_t entry = 0;
  ForEachSampleRun(in, [&](int32_t row, int64_t begin, int64_t end) {
    float weight_sum = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float w = per_id ? in.weights[i] : in.weights[0];
      weight_sum += combiner == Combiner::kMean ? w : w * w;
    }
    const float factor = CombinerFactor(weight_sum, combiner);
    for (; entry < count && rows[entry] == row; ++entry) gains[entry] *= factor;
  });
}

// The shared first half of docs/preprocessing.md#coo-conversion and docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform: validated, merged and normalised entries in input order.
Status BuildEntries(const IdInput& in, int64_t sample_count, Combiner combiner,
                    int64_t vocabulary_size, const Context& ctx, CooEntries* out) {
  SCE_RETURN_IF_ERROR(ValidateIdInput(in, sample_count, ctx));
  if (in.num_weights == 0 && in.num_values > 0) {
    return InvalidArgument(ctx.Describe(), ": weights must not be empty");
  }
  // Written through raw pointers into pre-sized vectors: this loop runs once per id per step.
  const int64_t n = in.num_values;
  out->rows.assign(n, 0);  // zeros: MergeEntries counts samples in it
  out->cols.resize(n);
  out->gains.resize(n);
  int32_t* out_rows = out->rows.data();
  int32_t* out_cols = out->cols.data();
  float* out_gains = out->gains.data();
  bool bad = false;
  const int64_t count = MergeEntries(in, vocabulary_size, out_rows, out_cols, out_gains, &bad);
  if (bad) return CheckIds(in, vocabulary_size, ctx);  // names the first bad id
  if (combiner != Combiner::kSum) ScaleByCombiner(in, combiner, count, out_rows, out_gains);
  out->rows.resize(count);
  out->cols.resize(count);
  out->gains.resize(count);
  return Status::Ok();
}

}  // namespace

Status ValidateStackingTransform(const StackingTransform& t, int64_t sample_count,
                                 const Context& context) {
  const std::string where = context.Describe();
  if (t.num_sc_per_chip < 1) {
    return InvalidArgument(where, ": num_sc_per_chip must be >= 1, got ", t.num_sc_per_chip);
  }
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "num_sc_per_chip", t.num_sc_per_chip, 1, kMaxSparseCoresPerChip));
  if (!IsPowerOfTwo(t.num_sc_shards)) {
    return InvalidArgument(where, ": num_sc_shards must be a power of two, got ", t.num_sc_shards);
  }
  if (t.row_offset < 0 || t.col_offset < 0 || t.col_shift < 0) {
    return InvalidArgument(where, ": row_offset, col_offset and col_shift must be >= 0");
  }
  // Stacked rows and cols are int32 in the COO outputs: bound every term before forming sums, so
  // nothing is truncated or wraps around silently.
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_sc_shards", t.num_sc_shards, 1, kMaxShards));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "stacked_table_sample_count",
                                   t.stacked_table_sample_count, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "row_offset", t.row_offset, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "col_offset", t.col_offset, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "col_shift", t.col_shift, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "sample_count", sample_count, 1, kMaxInt32));
  const int64_t sc = t.num_sc_per_chip;
  if (sample_count % sc != 0 || t.stacked_table_sample_count % sc != 0 || t.row_offset % sc != 0) {
    return InvalidArgument(where, ": sample_count (", sample_count, "), row_offset (", t.row_offset,
                           ") and stacked_table_sample_count (", t.stacked_table_sample_count,
                           ") must be divisible by the number of SparseCores per chip (", sc, ")");
  }
  if (t.row_offset + sample_count > t.stacked_table_sample_count) {
    return InvalidArgument(where, ": row_offset + sample_count (", t.row_offset + sample_count,
                           ") exceeds stacked_table_sample_count (", t.stacked_table_sample_count,
                           ")");
  }
  return Status::Ok();
}

Status ConvertToCoo(const IdInput& input, int64_t sample_count, Combiner combiner,
                    int64_t vocabulary_size, const Context& context, CooEntries* out) {
  return BuildEntries(input, sample_count, combiner, vocabulary_size, context, out);
}

Status ConvertToListOfCoo(const IdInput& input, int64_t sample_count, Combiner combiner,
                          const StackingTransform& t, int64_t vocabulary_size,
                          const Context& context, std::vector<CooEntries>* per_sc) {
  const std::string where = context.Describe();
  SCE_RETURN_IF_ERROR(ValidateStackingTransform(t, sample_count, context));
  const int64_t sc = t.num_sc_per_chip;
  CooEntries merged;
  SCE_RETURN_IF_ERROR(BuildEntries(input, sample_count, combiner, vocabulary_size, context, &merged));

  const int64_t per_sc_samples = sample_count / sc;
  const int64_t local_offset = t.row_offset / sc;
  const int64_t stacked_per_sc = t.stacked_table_sample_count / sc;
  const int64_t mask = t.num_sc_shards - 1;
  per_sc->assign(sc, CooEntries());
  std::vector<int64_t> counts(sc, 0);
  for (size_t k = 0; k < merged.size(); ++k) ++counts[merged.rows[k] / per_sc_samples];
  for (int64_t i = 0; i < sc; ++i) (*per_sc)[i].Reserve(counts[i]);
  for (size_t k = 0; k < merged.size(); ++k) {
    const int64_t row = merged.rows[k];
    const int64_t col = merged.cols[k];
    const int64_t i = row / per_sc_samples;
    const int64_t new_row = row % per_sc_samples + local_offset + stacked_per_sc * i;
    const int64_t new_col = ((col + t.col_shift) & mask) + (col & ~mask) + t.col_offset;
    if (new_col < 0 || new_col > kMaxInt32) {
      return InvalidArgument(where, ": id ", col, " maps to stacked column ", new_col,
                             " which does not fit in int32");
    }
    (*per_sc)[i].Push(static_cast<int32_t>(new_row), static_cast<int32_t>(new_col),
                      merged.gains[k]);
  }
  return Status::Ok();
}

}  // namespace sce
