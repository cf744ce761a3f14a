#include "cc/core/minibatch_splits.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <numeric>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/radix_sort.h"
#include "cc/core/split_encoding.h"

namespace sce {

Status MinibatchIdCountsSize(const std::string& where, int64_t num_replica,
                             int64_t num_sc_per_chip, int64_t max_division_level, int64_t* size) {
  int64_t num_shards, product;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "num_replica * num_sc_per_chip",
                                  {num_replica, num_sc_per_chip}, kMaxShards, &num_shards));
  SCE_RETURN_IF_ERROR(CheckDivisionLevel(where, max_division_level));
  SCE_RETURN_IF_ERROR(CheckedSize(
      where, "id_counts size num_sc_per_chip * num_replica * num_sc_per_chip * 2^max_division_level",
      {num_sc_per_chip, num_shards, int64_t{1} << max_division_level}, kMaxIdCounts, &product));
  *size = product + 1;
  return Status::Ok();
}

namespace {

// Every row sorted and within the batch, every id within the vocabulary, for positions
// [begin, end) (the row before `begin` is its predecessor).
Status ValidateIdRange(const int32_t* rows, const int32_t* cols, int64_t begin, int64_t end,
                       const MinibatchSplitsParams& p) {
  int32_t previous = begin > 0 ? rows[begin - 1] : 0;
  for (int64_t i = begin; i < end; ++i) {
    if (rows[i] < previous || rows[i] >= p.sample_count) {
      return InvalidArgument("table '", p.table_name, "': row_ids must be sorted and in [0, ",
                             p.sample_count, "); got ", rows[i], " at position ", i, " after ",
                             previous);
    }
    previous = rows[i];
    if (cols[i] < 0 || cols[i] >= p.table_vocab_size) {
      return InvalidArgument("table '", p.table_name, "': id ", cols[i], " at position ", i,
                             " is out of range [0, ", p.table_vocab_size, ")");
    }
  }
  return Status::Ok();
}

// ValidateIdRange over all ids, in parallel chunks; the error is the one of the first failing
// chunk, i.e. the first bad position, as a serial pass would report it.
Status ValidateIds(const int32_t* rows, const int32_t* cols, int64_t n,
                   const MinibatchSplitsParams& p, const ParallelFor& parallel_for) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Status> status(chunks);
  parallel_for(chunks, 4 * kChunk, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      status[c] = ValidateIdRange(rows, cols, c * kChunk, std::min(n, (c + 1) * kChunk), p);
    }
  });
  for (const Status& s : status) SCE_RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace

Status ValidateMinibatchSplitsParams(const MinibatchSplitsParams& p) {
  const std::string& t = p.table_name;
  if (p.num_sc_per_chip < 1 || p.num_replica < 1) {
    return InvalidArgument("table '", t, "': num_sc_per_chip and num_replica must be >= 1");
  }
  const std::string where = "table '" + t + "'";
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_replica", p.num_replica, 1, kMaxReplicas));
  SCE_RETURN_IF_ERROR(
      CheckInRange(where, "num_sc_per_chip", p.num_sc_per_chip, 1, kMaxSparseCoresPerChip));
  int64_t num_shards;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "num_replica * num_sc_per_chip",
                                  {p.num_replica, p.num_sc_per_chip}, kMaxShards, &num_shards));
  if (!IsPowerOfTwo(num_shards)) {
    return InvalidArgument("table '", t, "': num_replica * num_sc_per_chip (", num_shards,
                           ") must be a power of two");
  }
  int64_t id_counts_size;  // also checks max_division_level
  SCE_RETURN_IF_ERROR(MinibatchIdCountsSize(where, p.num_replica, p.num_sc_per_chip,
                                            p.max_division_level, &id_counts_size));
  if (p.sample_count < 1 || p.sample_count > kMaxInt32 || p.sample_count % p.num_sc_per_chip != 0) {
    return InvalidArgument("table '", t, "': sample_count (", p.sample_count,
                           ") must be a positive multiple of num_sc_per_chip (", p.num_sc_per_chip,
                           ") and at most ", kMaxInt32);
  }
  if (p.table_vocab_size < 1) {
    return InvalidArgument("table '", t, "': table_vocab_size must be >= 1, got ",
                           p.table_vocab_size);
  }
  if (p.max_ids_per_partition < 1 || p.max_unique_ids_per_partition < 1) {
    return InvalidArgument("table '", t,
                           "': max_ids_per_partition and max_unique_ids_per_partition must be >= 1");
  }
  return Status::Ok();
}

namespace {

// Ids and unique ids of one (source SC, target shard) pair over a range of divisions.
struct Cumulative {
  std::vector<int64_t> ids;      // ids[d] = number of ids in divisions [0, d)
  std::vector<int64_t> uniques;
  int64_t Ids(int64_t lo, int64_t hi) const { return ids[hi] - ids[lo]; }
  int64_t Uniques(int64_t lo, int64_t hi) const { return uniques[hi] - uniques[lo]; }
};

// The sizes every step shares: S SparseCores, P shards, 2^L = D vocabulary divisions.
struct Geometry {
  int64_t S, P, D, division_size, per_sc;
  int L, pbits;
  int32_t mask;
  double inverse_division;

  explicit Geometry(const MinibatchSplitsParams& params)
      : S(params.num_sc_per_chip),
        P(params.num_sc_per_chip * params.num_replica),
        D(int64_t{1} << params.max_division_level),
        // Ceiling division without forming table_vocab_size + D - 1 (overflows near INT64_MAX).
        division_size(params.table_vocab_size / D + (params.table_vocab_size % D != 0)),
        per_sc(params.sample_count / S),
        L(params.max_division_level),
        pbits(Log2(P)),
        mask(static_cast<int32_t>(P - 1)),
        inverse_division(1.0 / static_cast<double>(division_size)) {}

  // The vocabulary division of an id. Integer division is the hot spot here; divide in double
  // and correct the rounding.
  int32_t BucketOf(int32_t col) const {
    int64_t q = static_cast<int64_t>(static_cast<double>(col) * inverse_division);
    if (q * division_size > col) --q;
    if ((q + 1) * division_size <= col) ++q;
    return static_cast<int32_t>(std::min<int64_t>(q, D - 1));
  }
};

// One deduplicated id of a source SparseCore, before it is scattered into the output.
struct Kept {
  int32_t local_row, col;
  float gain;
};

// A SparseCore's deduplicated ids in output order. A plain array written through a pointer: a
// std::vector's push_back keeps its end pointer in memory and checks capacity on every id.
struct KeptIds {
  std::unique_ptr<Kept[]> data;  // default-initialized: nothing is written twice
  int64_t size = 0;
};

// Per (shard, division) counts of one SparseCore; at most n <= 2^31 - 1 ids, so int32 (these
// arrays have up to 2^24 entries). Slot p * (D + 1) + d + 1 counts shard p, division d.
struct ScCounts {
  std::vector<int32_t> ids, uniques;
};

// Bits needed to hold the values 0..x (x >= 0).
int BitsFor(int64_t x) {
  int bits = 0;
  while (bits < 63 && (x >> bits) != 0) ++bits;
  return bits;
}

// The word format of a SparseCore with n ids and cols up to max_col. The key puts the shard
// (col & mask) above the shard's row (col >> pbits): a bijection of col, so equal cols stay
// adjacent, and the shard's ids come out in col order, hence division by division. Rows are
// sorted, so the stable sort orders ties by (row, position). Each id travels as one word: key,
// then (when everything fits in 64 bits) its row inside the SparseCore, then its position, so the
// merge reads rows and cols from the sorted words and gathers only the gains by position.
SortWordFormat FormatFor(int64_t n, int32_t max_col, const Geometry& g) {
  SortWordFormat f;
  f.pbits = g.pbits;
  f.shard_mask = g.mask;
  f.shard_row_bits = BitsFor(max_col >> g.pbits);
  f.key_bits = g.pbits + f.shard_row_bits;
  f.position_bits = std::max(BitsFor(std::max<int64_t>(n - 1, 0)), 1);
  f.row_bits = BitsFor(std::max<int64_t>(g.per_sc - 1, 0));
  f.rows_in_words = f.key_bits + f.row_bits + f.position_bits <= 64;
  f.key_shift = f.rows_in_words ? f.row_bits + f.position_bits : 32;
  f.row_mask = f.rows_in_words ? ~uint64_t{0} : 0;
  return f;
}

// One thread's buffers for a SparseCore's ids, kept between calls and grown, never shrunk
// (default-initialized: the source writes every entry it reads back).
struct ScScratch {
  std::unique_ptr<uint64_t[]> words;  // 2 n: the sort's two buffers
  std::unique_ptr<float[]> gains;
  std::unique_ptr<int32_t[]> rows;
  int64_t capacity = 0;
  void Reserve(int64_t n) {
    if (n <= capacity) return;
    capacity = n;
    words.reset(new uint64_t[2 * n]);
    gains.reset(new float[n]);
    rows.reset(new int32_t[n]);
  }
};

// Sorts the ids of source SparseCore s by (shard, col), sums the gains of duplicate (row, col)
// pairs into `kept` and counts ids and unique ids per (shard, division). `kept` is then in output
// order: by shard, division (a division is a range of cols), col, row.
Status DedupAndCountSc(const SplitsIdSource& source, int64_t s, const Geometry& g,
                       ScScratch* scratch, ScCounts* counts, KeptIds* kept) {
  const int64_t n = source.Count(s);
  const SortWordFormat f = FormatFor(n, source.MaxCol(s), g);
  const uint64_t position_mask = (uint64_t{1} << f.position_bits) - 1;
  const uint64_t row_mask = (uint64_t{1} << f.row_bits) - 1;
  const int32_t shard_row_mask = static_cast<int32_t>((int64_t{1} << f.shard_row_bits) - 1);
  scratch->Reserve(std::max<int64_t>(n, 1));
  uint64_t* words = scratch->words.get();
  const float* gains = nullptr;
  const int32_t* rows = scratch->rows.get();  // read only without rows_in_words
  SCE_RETURN_IF_ERROR(
      source.Fill(s, f, words, scratch->gains.get(), scratch->rows.get(), &gains));
  const uint64_t* sorted = StableSortWords(words, words + n, n, f.key_shift, f.key_bits);
  std::fill(counts->ids.begin(), counts->ids.end(), 0);
  std::fill(counts->uniques.begin(), counts->uniques.end(), 0);
  kept->data.reset(new Kept[std::max<int64_t>(n, 1)]);
  Kept* out = kept->data.get();
  int64_t size = 0;
  int32_t prev_row = -1, prev_col = -1;
  // Within a shard cols arrive in increasing order, so the division changes at most D - 1 times
  // per shard: it is recomputed only when a col leaves the current one.
  int32_t bucket = 0;
  int64_t bucket_begin = 0, bucket_end = -1;
  // The counts of the current (shard, division) slot are kept in registers and stored when the
  // slot changes (at most P * D times): incrementing the same memory word for every id makes
  // each id wait for the previous id's store.
  int64_t run_slot = 0;
  int32_t run_ids = 0, run_uniques = 0;
  int32_t* ids = counts->ids.data();
  int32_t* uniques = counts->uniques.data();
  const bool rows_in_words = f.rows_in_words;
  const int key_shift = f.key_shift, position_bits = f.position_bits;
  const int shard_row_bits = f.shard_row_bits;
  for (int64_t k = 0; k < n; ++k) {
    // Decoded into locals: the int32 stores into `out` below would otherwise make the compiler
    // assume that the inputs may have changed.
    const uint64_t word = sorted[k];
    const int64_t i = static_cast<int64_t>(word & position_mask);
    const int32_t key = static_cast<int32_t>(word >> key_shift);
    const int32_t col = ((key & shard_row_mask) << g.pbits) | (key >> shard_row_bits);
    const int32_t row = rows_in_words
                            ? static_cast<int32_t>((word >> position_bits) & row_mask)
                            : rows[i];
    const float gain = gains[i];
    if (row == prev_row && col == prev_col) {
      out[size - 1].gain += gain;
      continue;
    }
    if (col >= bucket_end || col < bucket_begin) {
      bucket = g.BucketOf(col);
      bucket_begin = bucket * g.division_size;
      bucket_end = bucket == g.D - 1 ? INT64_MAX : (bucket + int64_t{1}) * g.division_size;
    }
    const int64_t slot = (col & g.mask) * (g.D + 1) + bucket + 1;
    if (slot != run_slot) {
      ids[run_slot] += run_ids;
      uniques[run_slot] += run_uniques;
      run_slot = slot;
      run_ids = 0;
      run_uniques = 0;
    }
    ++run_ids;
    run_uniques += col != prev_col;
    out[size++] = {row, col, gain};
    prev_row = row;
    prev_col = col;
  }
  // Slot 0 is never a (shard, division) slot: the first flush adds zeros to it.
  ids[run_slot] += run_ids;
  uniques[run_slot] += run_uniques;
  kept->size = size;
  return Status::Ok();
}

// Checks every division of pair (s, p) against the limits and writes its id_counts prefix sums;
// returns the pair's id count in *pair_ids.
Status CountPair(const ScCounts& counts, int64_t s, int64_t p, const Geometry& g,
                 const MinibatchSplitsParams& params, MinibatchSplits* out, int64_t* pair_ids) {
  const int64_t pair = s * g.P + p;
  const int32_t* pid = &counts.ids[p * (g.D + 1)];
  const int32_t* puq = &counts.uniques[p * (g.D + 1)];
  *pair_ids = 0;
  for (int64_t i = 1; i <= g.D; ++i) {
    *pair_ids += pid[i];
    if (pid[i] > params.max_ids_per_partition || puq[i] > params.max_unique_ids_per_partition) {
      return InvalidArgument("table '", params.table_name, "' has too many ids for replica ", p,
                             " on sparse core ", s, ": one vocabulary division holds ", pid[i],
                             " ids (", puq[i], " unique) but the limits are ",
                             params.max_ids_per_partition, " ids and ",
                             params.max_unique_ids_per_partition,
                             " unique ids per partition. Consider making the "
                             "max_division_level higher or raising the limits");
    }
    out->id_counts[pair * g.D + i] =
        out->id_counts[pair * g.D + i - 1] + static_cast<int32_t>(pid[i]);
  }
  return Status::Ok();
}

// Adds the split points pair (s, p) needs: `pre` (the top-down split mask, shared by all pairs)
// and `after` (the greedily merged mask that is the op's output).
void SplitPair(const ScCounts& counts, int64_t p, const Geometry& g,
               const MinibatchSplitsParams& params, Cumulative* cum, MinibatchSplits* out,
               int64_t* pre, int64_t* after) {
  const int32_t* pid = &counts.ids[p * (g.D + 1)];
  const int32_t* puq = &counts.uniques[p * (g.D + 1)];
  for (int64_t d = 0; d <= g.D; ++d) {
    cum->ids[d] = (d == 0 ? 0 : cum->ids[d - 1]) + pid[d];
    cum->uniques[d] = (d == 0 ? 0 : cum->uniques[d - 1]) + puq[d];
  }
  out->max_ids = std::max(out->max_ids, cum->ids[g.D]);
  out->max_uniques = std::max(out->max_uniques, cum->uniques[g.D]);
  auto too_big = [&](int64_t lo, int64_t hi) {
    return cum->Ids(lo, hi) > params.max_ids_per_partition ||
           cum->Uniques(lo, hi) > params.max_unique_ids_per_partition;
  };
  // Top-down search: split a section when it does not fit and its parent was split.
  for (int level = 0; level < g.L; ++level) {
    const int64_t width = g.D >> level;
    for (int64_t q = 0; q < (int64_t{1} << level); ++q) {
      if (level > 0) {
        const int64_t parent = ((int64_t{1} << (level - 1)) - 1) + q / 2;
        if (((*pre >> parent) & 1) == 0) continue;
      }
      if (too_big(q * width, (q + 1) * width)) *pre |= int64_t{1} << (((int64_t{1} << level) - 1) + q);
    }
  }
  // Greedy merge of adjacent sections that fit together.
  std::vector<int32_t> points = BinaryToBucketSplits(*pre, g.L);
  points.insert(points.begin(), 0);
  points.push_back(static_cast<int32_t>(g.D));
  std::vector<int32_t> emitted;
  size_t start = 0;
  for (size_t i = 1; i < points.size(); ++i) {
    if (!too_big(points[start], points[i])) continue;
    emitted.push_back(points[i - 1]);
    start = i - 1;
  }
  *after |= BucketSplitsToBinary(emitted, g.L);
}

// Writes the kept ids of every SparseCore into the output, grouped by (SC, shard, division):
// each SparseCore's kept ids are already in that order (DedupAndCountSc), so SparseCore s's
// block, which starts at id_counts[s * P * D], is written in one sequential pass. The blocks are
// disjoint, so they are written in parallel.
void Scatter(const std::vector<KeptIds>& kept_per_sc, const Geometry& g,
             const std::vector<int32_t>& id_counts, const SplitIdBuffers& buffers,
             const ParallelFor& parallel_for) {
  const int64_t total = id_counts.back();
  parallel_for(g.S, 4 * (total / g.S + 1), [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      int64_t slot = id_counts[s * g.P * g.D];
      const KeptIds& kept = kept_per_sc[s];
      for (int64_t j = 0; j < kept.size; ++j) {
        const Kept& k = kept.data[j];
        buffers.rows[slot] = k.local_row;
        buffers.cols[slot] = k.col >> g.pbits;
        buffers.gains[slot] = k.gain;
        ++slot;
      }
    }
  });
}

}  // namespace

Status GetMinibatchSplitsFrom(const SplitsIdSource& source, const MinibatchSplitsParams& params,
                              MinibatchSplits* out, const ParallelFor& parallel_for,
                              const SplitIdAllocator& allocate) {
  const Geometry g(params);
  int64_t n = 0;
  for (int64_t s = 0; s < g.S; ++s) {
    if (!CheckedAdd(n, source.Count(s), &n) || n > kMaxInt32) {
      return InvalidArgument("table '", params.table_name,
                             "': more than 2^31 - 1 ids do not fit the int32 buffer formats");
    }
  }
  out->id_counts.assign(g.S * g.P * g.D + 1, 0);
  out->max_ids = 0;
  out->max_uniques = 0;
  // The SparseCores' sorts and counts are independent: one unit of work each.
  std::vector<KeptIds> kept_per_sc(g.S);
  std::vector<ScCounts> counts(g.S);
  std::vector<Status> status(g.S);
  parallel_for(g.S, 200 * (n / g.S + 1), [&](int64_t first, int64_t last) {
    thread_local ScScratch scratch;
    for (int64_t s = first; s < last; ++s) {
      counts[s].ids.resize(g.P * (g.D + 1));
      counts[s].uniques.resize(g.P * (g.D + 1));
      status[s] = DedupAndCountSc(source, s, g, &scratch, &counts[s], &kept_per_sc[s]);
    }
  });
  for (const Status& st : status) SCE_RETURN_IF_ERROR(st);
  // The limits and the split masks, pair by pair in (SparseCore, shard) order: the top-down mask
  // is shared, so this order is part of the result.
  int64_t pre = 0, after = 0;
  Cumulative cum;
  cum.ids.resize(g.D + 1);
  cum.uniques.resize(g.D + 1);
  for (int64_t s = 0; s < g.S; ++s) {
    for (int64_t p = 0; p < g.P; ++p) {
      int64_t pair_ids;
      SCE_RETURN_IF_ERROR(CountPair(counts[s], s, p, g, params, out, &pair_ids));
      // A pair without ids cannot be too big for any section (the limits are >= 1): it changes
      // neither the maxima nor the split masks. Skipping it keeps a call with many shards and
      // few ids (up to 2^24 id_counts entries) cheap.
      if (pair_ids == 0) continue;
      SplitPair(counts[s], p, g, params, &cum, out, &pre, &after);
    }
  }
  const int64_t total = out->id_counts.back();
  SplitIdBuffers buffers;
  if (allocate) {
    SCE_RETURN_IF_ERROR(allocate(total, &buffers));
  } else {
    out->rows.resize(total);
    out->cols.resize(total);
    out->gains.resize(total);
    buffers = {out->rows.data(), out->cols.data(), out->gains.data()};
  }
  Scatter(kept_per_sc, g, out->id_counts, buffers, parallel_for);
  out->splits = after;
  return Status::Ok();
}

namespace {

// The op's input: one concatenated COO (rows validated sorted, so SparseCore s's ids are one
// range, found by binary search).
class CooArraySource : public SplitsIdSource {
 public:
  CooArraySource(const int32_t* rows, const int32_t* cols, const float* gains, int64_t n,
                 int64_t num_sc, int64_t per_sc)
      : rows_(rows), cols_(cols), gains_(gains), begin_(num_sc + 1, n) {
    begin_[0] = 0;
    for (int64_t s = 1; s < num_sc; ++s) {
      begin_[s] = std::lower_bound(rows + begin_[s - 1], rows + n, s * per_sc) - rows;
    }
    per_sc_ = per_sc;
  }
  int64_t Count(int64_t s) const override { return begin_[s + 1] - begin_[s]; }
  int32_t MaxCol(int64_t s) const override {
    int32_t max_col = 0;
    for (int64_t i = begin_[s]; i < begin_[s + 1]; ++i) max_col = std::max(max_col, cols_[i]);
    return max_col;
  }
  Status Fill(int64_t s, const SortWordFormat& format, uint64_t* words, float* /*gain_scratch*/,
              int32_t* row_scratch, const float** gains) const override {
    // A local copy: stores into `words` would otherwise make the compiler reload its fields for
    // every id.
    const SortWordFormat f = format;
    const int64_t begin = begin_[s], n = begin_[s + 1] - begin;
    const int32_t first_row = static_cast<int32_t>(s * per_sc_);
    const int32_t* rows = rows_ + begin;
    const int32_t* cols = cols_ + begin;
    for (int64_t i = 0; i < n; ++i) {
      words[i] = f.Pack(static_cast<uint64_t>(cols[i]),
                        static_cast<uint64_t>(rows[i] - first_row), static_cast<uint64_t>(i));
    }
    if (!f.rows_in_words) {
      for (int64_t i = 0; i < n; ++i) row_scratch[i] = rows[i] - first_row;
    }
    *gains = gains_ + begin;
    return Status::Ok();
  }

 private:
  const int32_t* rows_;
  const int32_t* cols_;
  const float* gains_;
  std::vector<int64_t> begin_;
  int64_t per_sc_ = 0;
};

}  // namespace

Status GetMinibatchSplits(const int32_t* rows, const int32_t* cols, const float* gains,
                          int64_t n, int64_t num_cols, int64_t num_gains,
                          const MinibatchSplitsParams& params, MinibatchSplits* out,
                          const ParallelFor& parallel_for, const SplitIdAllocator& allocate) {
  if (n != num_cols || n != num_gains) {
    return InvalidArgument("table '", params.table_name, "': row_ids (", n, "), col_ids (",
                           num_cols, ") and gains (", num_gains, ") must have the same length");
  }
  SCE_RETURN_IF_ERROR(ValidateMinibatchSplitsParams(params));
  if (n > kMaxInt32) {
    return InvalidArgument("table '", params.table_name, "': ", n,
                           " ids do not fit the int32 buffer formats");
  }
  SCE_RETURN_IF_ERROR(ValidateIds(rows, cols, n, params, parallel_for));
  const CooArraySource source(rows, cols, gains, n, params.num_sc_per_chip,
                              params.sample_count / params.num_sc_per_chip);
  return GetMinibatchSplitsFrom(source, params, out, parallel_for, allocate);
}

}  // namespace sce
