#include "cc/core/minibatch_splits.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <numeric>


#include "cc/core/avx512.h"
#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/radix_sort.h"
#include "cc/core/range_scan.h"
#include "cc/core/split_encoding.h"
#include "cc/core/vector_isa.h"

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
  // The first bad position as one pass checking each row, then its id, would find it.
  const auto shifted = [begin](int64_t index) { return index < 0 ? index : index + begin; };
  const int64_t bad_row = shifted(FirstUnsortedOrOutOfRange(
      rows + begin, end - begin, p.sample_count, begin > 0 ? rows[begin - 1] : 0));
  const int64_t bad_col = shifted(FirstOutOfRange(cols + begin, end - begin, p.table_vocab_size));
  const int64_t i = bad_row < 0 ? bad_col : (bad_col < 0 ? bad_row : std::min(bad_row, bad_col));
  if (i < 0) return Status::Ok();
  if (i == bad_row) {
    return InvalidArgument("table '", p.table_name, "': row_ids must be sorted and in [0, ",
                           p.sample_count, "); got ", rows[i], " at position ", i, " after ",
                           i > 0 ? rows[i - 1] : 0);
  }
  return InvalidArgument("table '", p.table_name, "': id ", cols[i], " at position ", i,
                         " is out of range [0, ", p.table_vocab_size, ")");
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

// A SparseCore's deduplicated ids in output order, as the output's three columns (rows inside the
// SparseCore, rows inside the shard, gains), so that scattering them is three copies. Plain
// arrays written through pointers (a std::vector's push_back keeps its end pointer in memory and
// checks capacity on every id), default-initialized: nothing is written twice.
struct KeptIds {
  std::unique_ptr<int32_t[]> local_rows, shard_rows;
  std::unique_ptr<float[]> gains;
  int64_t size = 0;
  void Reset(int64_t n) {
    local_rows.reset(new int32_t[n]);
    shard_rows.reset(new int32_t[n]);
    gains.reset(new float[n]);
    size = 0;
  }
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

// The running state of DedupAndCountSc's pass over the sorted ids.
struct DedupState {
  int64_t size = 0;                    // kept ids so far
  int32_t prev_row = -1, prev_col = -1;  // the previous id's (-1 before the first: matches none)
  // The division of the current col: recomputed only when a col leaves it (within a shard cols
  // arrive in increasing order, so at most D - 1 times per shard).
  int32_t bucket = 0;
  int64_t bucket_begin = 0, bucket_end = -1;
  // The counts of the current (shard, division) slot, kept in registers and stored when the slot
  // changes (at most P * D times): incrementing the same memory word for every id makes each id
  // wait for the previous id's store. Slot 0 is no (shard, division) slot.
  int64_t run_slot = 0;
  int32_t run_ids = 0, run_uniques = 0;
};

// One sorted id of DedupAndCountSc: merged into the previous kept id when (row, col) repeats,
// else counted in its slot and kept.
__attribute__((always_inline)) inline void DedupOne(int32_t row, int32_t col, float gain,
                                                    const Geometry& g, DedupState* st,
                                                    int32_t* ids, int32_t* uniques,
                                                    KeptIds* kept) {
  if (row == st->prev_row && col == st->prev_col) {
    kept->gains[st->size - 1] += gain;
    return;
  }
  if (col >= st->bucket_end || col < st->bucket_begin) {
    st->bucket = g.BucketOf(col);
    st->bucket_begin = st->bucket * g.division_size;
    st->bucket_end =
        st->bucket == g.D - 1 ? INT64_MAX : (st->bucket + int64_t{1}) * g.division_size;
  }
  const int64_t slot = (col & g.mask) * (g.D + 1) + st->bucket + 1;
  if (slot != st->run_slot) {
    ids[st->run_slot] += st->run_ids;
    uniques[st->run_slot] += st->run_uniques;
    st->run_slot = slot;
    st->run_ids = 0;
    st->run_uniques = 0;
  }
  ++st->run_ids;
  st->run_uniques += col != st->prev_col;
  kept->local_rows[st->size] = row;
  kept->shard_rows[st->size] = col >> g.pbits;
  kept->gains[st->size] = gain;
  ++st->size;
  st->prev_row = row;
  st->prev_col = col;
}

// The sorted words [begin, end) of DedupAndCountSc, one at a time: the word gives the position,
// the key and (with rows_in_words) the row; the gain is gathered by position.
__attribute__((always_inline)) inline void DedupScalar(
    const uint64_t* sorted, int64_t begin, int64_t end, const SortWordFormat& f,
    const int32_t* rows, const float* gains, const Geometry& g, DedupState* st, int32_t* ids,
    int32_t* uniques, KeptIds* kept) {
  // Decoded into locals: the int32 stores into `kept` would otherwise make the compiler assume
  // that the inputs may have changed.
  const uint64_t position_mask = (uint64_t{1} << f.position_bits) - 1;
  const uint64_t row_mask = (uint64_t{1} << f.row_bits) - 1;
  const int32_t shard_row_mask = static_cast<int32_t>((int64_t{1} << f.shard_row_bits) - 1);
  const bool rows_in_words = f.rows_in_words;
  const int key_shift = f.key_shift, position_bits = f.position_bits;
  const int shard_row_bits = f.shard_row_bits;
  for (int64_t k = begin; k < end; ++k) {
    const uint64_t word = sorted[k];
    const int64_t i = static_cast<int64_t>(word & position_mask);
    const int32_t key = static_cast<int32_t>(word >> key_shift);
    const int32_t col = ((key & shard_row_mask) << g.pbits) | (key >> shard_row_bits);
    const int32_t row = rows_in_words
                            ? static_cast<int32_t>((word >> position_bits) & row_mask)
                            : rows[i];
    DedupOne(row, col, gains[i], g, st, ids, uniques, kept);
  }
}

void DedupLoopBaseline(const uint64_t* sorted, int64_t n, const SortWordFormat& f,
                       const int32_t* rows, const float* gains, const Geometry& g,
                       DedupState* st, int32_t* ids, int32_t* uniques, KeptIds* kept) {
  DedupScalar(sorted, 0, n, f, rows, gains, g, st, ids, uniques, kept);
}

#if defined(__x86_64__)
SCE_AVX512_CODE_BEGIN

// The 32-bit lanes of two vectors of 8 64-bit values, low vector first.
__attribute__((target("avx512f"), always_inline)) inline __m512i Narrow(__m512i lo, __m512i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)),
                            _mm512_cvtepi64_epi32(hi), 1);
}

// The same with AVX-512, 16 words at a time, for words that hold the rows. A block whose ids all
// fall into the current (shard, division) slot (the common case: its first and last col do, and
// the cols are sorted) is decoded, deduplicated and counted in registers: the duplicates' gains
// add in input order (SumMergedRunsAvx512, avx512.h), the slot's counts grow by the kept lanes
// and by the lanes whose col differs from the one before, and the kept lanes are packed to the
// front and stored. Any other block takes DedupScalar. Same kept ids, counts and summation order
// as the scalar loop.
__attribute__((target("avx512f"))) void DedupLoopAvx512(
    const uint64_t* sorted, int64_t n, const SortWordFormat& f, const int32_t* rows,
    const float* gains, const Geometry& g, DedupState* st, int32_t* ids, int32_t* uniques,
    KeptIds* kept) {
  const __m512i position_mask = _mm512_set1_epi64((int64_t{1} << f.position_bits) - 1);
  const __m512i row_mask = _mm512_set1_epi64((int64_t{1} << f.row_bits) - 1);
  const __m512i shard_row_mask =
      _mm512_set1_epi32(static_cast<int32_t>((int64_t{1} << f.shard_row_bits) - 1));
  const __m128i key_shift = _mm_cvtsi32_si128(f.key_shift);
  const __m128i position_bits = _mm_cvtsi32_si128(f.position_bits);
  const __m128i pbits = _mm_cvtsi32_si128(g.pbits);
  const __m128i shard_row_bits = _mm_cvtsi32_si128(f.shard_row_bits);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512i w0 = _mm512_loadu_si512(sorted + k);
    const __m512i w1 = _mm512_loadu_si512(sorted + k + 8);
    const __m512i key = Narrow(_mm512_srl_epi64(w0, key_shift), _mm512_srl_epi64(w1, key_shift));
    const __m512i col =
        _mm512_or_si512(_mm512_sll_epi32(_mm512_and_si512(key, shard_row_mask), pbits),
                        _mm512_srl_epi32(key, shard_row_bits));
    alignas(64) int32_t cols[16];
    _mm512_store_si512(cols, col);
    // The block's first and last col in the current slot: every col between them is. A block
    // that lies wholly or partly in another slot (or starts a new one) takes the scalar loop.
    const int32_t first = cols[0], last = cols[15];
    const int64_t first_slot = (first & g.mask) * (g.D + 1) + st->bucket + 1;
    if (first < st->bucket_begin || last >= st->bucket_end || (first & g.mask) != (last & g.mask) ||
        first_slot != st->run_slot) {
      DedupScalar(sorted, k, k + 16, f, rows, gains, g, st, ids, uniques, kept);
      continue;
    }
    const __m512i row = Narrow(
        _mm512_and_si512(_mm512_srl_epi64(w0, position_bits), row_mask),
        _mm512_and_si512(_mm512_srl_epi64(w1, position_bits), row_mask));
    const __m512i position =
        Narrow(_mm512_and_si512(w0, position_mask), _mm512_and_si512(w1, position_mask));
    const __m512 gain = _mm512_i32gather_ps(position, gains, 4);
    const __m512i prev_rows = _mm512_set1_epi32(st->prev_row);
    const __m512i prev_cols = _mm512_set1_epi32(st->prev_col);
    // Lane j of alignr(v, previous, 15) is the id before lane j (lane 15 of `previous` for j = 0).
    const __mmask16 new_col =
        _mm512_cmpneq_epi32_mask(col, _mm512_alignr_epi32(col, prev_cols, 15));
    const unsigned merges =
        _mm512_cmpeq_epi32_mask(row, _mm512_alignr_epi32(row, prev_rows, 15)) &
        static_cast<unsigned>(static_cast<__mmask16>(~new_col));
    // The vector path starts after an id was kept (run_slot is 0 until then), so a leading
    // merge has an entry to add to.
    const __m512 sums = SumMergedRunsAvx512(gain, merges, kept->gains.get() + st->size - 1);
    const __mmask16 kept_lanes = static_cast<__mmask16>(~merges);
    const int64_t count = __builtin_popcount(static_cast<unsigned>(kept_lanes));
    // Every lane of new_col is a kept lane (a merged lane repeats its col).
    st->run_ids += static_cast<int32_t>(count);
    st->run_uniques += __builtin_popcount(static_cast<unsigned>(new_col));
    _mm512_storeu_si512(kept->local_rows.get() + st->size,
                        _mm512_maskz_compress_epi32(kept_lanes, row));
    const __m512i shard_rows = _mm512_and_si512(key, shard_row_mask);  // col >> pbits
    _mm512_storeu_si512(kept->shard_rows.get() + st->size,
                        _mm512_maskz_compress_epi32(kept_lanes, shard_rows));
    _mm512_storeu_ps(kept->gains.get() + st->size, _mm512_maskz_compress_ps(kept_lanes, sums));
    st->size += count;
    st->prev_row = LastLane(row);
    st->prev_col = last;
  }
  DedupScalar(sorted, k, n, f, rows, gains, g, st, ids, uniques, kept);
}
SCE_AVX512_CODE_END
#endif  // defined(__x86_64__)

// Sorts the ids of source SparseCore s by (shard, col), sums the gains of duplicate (row, col)
// pairs into `kept` and counts ids and unique ids per (shard, division). `kept` is then in output
// order: by shard, division (a division is a range of cols), col, row.
Status DedupAndCountSc(const SplitsIdSource& source, int64_t s, const Geometry& g,
                       ScScratch* scratch, ScCounts* counts, KeptIds* kept) {
  const int64_t n = source.Count(s);
  const SortWordFormat f = FormatFor(n, source.MaxCol(s), g);
  scratch->Reserve(std::max<int64_t>(n, 1));
  uint64_t* words = scratch->words.get();
  const float* gains = nullptr;
  const int32_t* rows = scratch->rows.get();  // read only without rows_in_words
  SCE_RETURN_IF_ERROR(
      source.Fill(s, f, words, scratch->gains.get(), scratch->rows.get(), &gains));
  const uint64_t* sorted = StableSortWords(words, words + n, n, f.key_shift, f.key_bits);
  std::fill(counts->ids.begin(), counts->ids.end(), 0);
  std::fill(counts->uniques.begin(), counts->uniques.end(), 0);
  kept->Reset(std::max<int64_t>(n, 1));
  DedupState st;
  auto* loop = &DedupLoopBaseline;
#if defined(__x86_64__)
  // The vector loop stores whole 16-lane vectors at the kept count (<= the words read so far),
  // so its buffers need n >= 16; it reads the rows from the words.
  if (CpuHasAvx512F() && f.rows_in_words && n >= 16) loop = &DedupLoopAvx512;
#endif
  loop(sorted, n, f, rows, gains, g, &st, counts->ids.data(), counts->uniques.data(), kept);
  counts->ids[st.run_slot] += st.run_ids;  // slot 0 gets the zeros of an empty pass
  counts->uniques[st.run_slot] += st.run_uniques;
  kept->size = st.size;
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
// block, which starts at id_counts[s * P * D], is three copies of its kept columns. The blocks
// are disjoint, so they are written in parallel.
void Scatter(const std::vector<KeptIds>& kept_per_sc, const Geometry& g,
             const std::vector<int32_t>& id_counts, const SplitIdBuffers& buffers,
             const ParallelFor& parallel_for) {
  const int64_t total = id_counts.back();
  parallel_for(g.S, 4 * (total / g.S + 1), [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      const int64_t slot = id_counts[s * g.P * g.D];
      const KeptIds& kept = kept_per_sc[s];
      std::copy_n(kept.local_rows.get(), kept.size, buffers.rows + slot);
      std::copy_n(kept.shard_rows.get(), kept.size, buffers.cols + slot);
      std::copy_n(kept.gains.get(), kept.size, buffers.gains + slot);
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
