// The backward pass with a fused optimizer (docs/optimizers.md#gradient-accumulation): gradients of every entry that references
// a table row are summed first (across samples, SparseCores, minibatches and features), then the
// optimizer updates that row once, in place. Rows that are not referenced are never touched, so the
// cost of a step depends on the batch, not on the vocabulary size.
#ifndef SCE_CORE_FUSED_UPDATE_H_
#define SCE_CORE_FUSED_UPDATE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/core/activation_rows.h"
#include "cc/core/checked_math.h"
#include "cc/core/csr_view.h"
#include "cc/core/optimizers.h"
#include "cc/core/parallel.h"
#include "cc/core/row_precision.h"
#include "cc/core/vector_isa.h"

namespace sce {

// One gradient contribution to a row of a shard.
struct RowContribution {
  int32_t token;        // row inside the shard
  int32_t activation;   // activation row (CSR numbering: source_sc * samples_per_sc + sample)
  float gain;
  int32_t source_sc;    // the source SparseCore whose sample it is
};

// sum[0:dim] += gain * g[0:dim]. Always inlined, so it is vectorized for the ISA of the update
// loop it is inlined into (see UpdateShards).
__attribute__((always_inline)) inline void AccumulateScaled(float* sum, const float* g, float gain,
                                                            int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) sum[j] += gain * g[j];
}

// All contributions to shard p (a global shard index), sorted by token (stable, so the summation
// order is fixed: source SparseCore, minibatch, position). The update's fallback for CSRs whose
// segments are not sorted runs (given by hand) or that have more than kMaxStreamedRuns of them.
void CollectShardContributions(const CsrView& view, int64_t p, std::vector<RowContribution>* out);

// One segment (source SparseCore, minibatch) of a shard, read in place as a sorted run: `next` is
// the position of its first unread valid entry (padding skipped), `head_token` that entry's token
// (kPad once the run is exhausted).
struct ContributionRun {
  int64_t next = 0;
  int64_t end = 0;
  int64_t source_sc = 0;  // its activation rows are source_sc * samples_per_sc + sample
  int32_t head_token = kPad;
};

// The update merges at most this many runs per shard while it reads them (one head comparison
// per run and table row); more runs, or unsorted ones, take CollectShardContributions.
constexpr size_t kMaxStreamedRuns = 32;

// Fills `runs` with the segments of shard p (a global shard index) in summation order and returns
// true when every segment is sorted by token (padding ignored) and there are at most
// kMaxStreamedRuns non-empty ones. The preprocessing ops and the all-to-all exchange produce
// sorted segments; the one-replica open-vocabulary lookup lists its rows in the order its maps
// numbered them (exchanges/dynamic.py), so its update collects and sorts them instead.
bool FindSortedRuns(const CsrView& view, int64_t p, std::vector<ContributionRun>* runs);

// Moves a run to its next valid (non-padding) entry at or after `run->next`.
__attribute__((always_inline)) inline void SkipPadding(const CsrView& view, ContributionRun* run) {
  while (run->next < run->end &&
         (view.token_ids[run->next] == kPad || view.sample_ids[run->next] == kPad)) {
    ++run->next;
  }
  run->head_token = run->next < run->end ? view.token_ids[run->next] : kPad;
}

// What the fused update does with non-finite (NaN or +-Inf) gradient contributions: fail the step
// before anything is written (the default), or skip the table rows they would touch and count them.
enum class NonFiniteGradients { kError, kSkip };
Status ParseNonFiniteGradients(const std::string& name, NonFiniteGradients* mode);

// True when no value of x[0:n] is NaN or +-Inf. One vectorizable pass (bit test on the exponent),
// multiversioned for AVX-512 and AVX2.
bool AllFinite(const float* x, int64_t n);

// The first contribution (in shard, source SparseCore, minibatch, position order) of the local
// shards whose activation gradient row or gain is not finite.
struct NonFiniteContribution {
  bool found = false;
  int64_t shard = 0;           // global shard index
  int64_t token = 0;           // row inside the shard
  int64_t table_row = 0;       // row of the (local) table
  int64_t activation_row = 0;  // row of activation_gradients
  int64_t position = 0;        // position in the id buffers
  float gain = 0.0f;
  bool bad_gain = false;
};

// Marks the activation rows holding a non-finite value (one flag per row of grads) and finds the
// first referenced non-finite contribution. Only called when AllFinite failed on the gradients or
// the gains, so it is off the hot path. `view` must have passed ValidateCsrView.
void FindNonFiniteContributions(const CsrView& view, const GradientRows& grads, int64_t dim,
                                std::vector<uint8_t>* bad_activation_rows,
                                NonFiniteContribution* first);

// Prefetches the cache lines of `bytes` bytes at p (a row of a table, slot or gradient buffer).
__attribute__((always_inline)) inline void PrefetchRow(const void* p, int64_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(c + line);
}

// How far ahead the update prefetches gradient rows and table / slot rows: far enough to hide a
// memory access behind the work in between. In merged contributions (the fallback), in entries.
// In the streamed update (UpdateShardFromRuns), each pass prefetches what it alone reads, ahead
// in a plain array: gradient rows a number of listed contributions ahead (SumListedRows), table
// and slot rows a number of summed rows ahead (ApplyRowSums). On the benchmark workload
// (bench/kernel_ab.py; BENCHMARKS.md, "Design measurements") 16 rows ahead takes 3% less time
// than 8, and 4 is 2% slower than 8; 32 is about 2% faster than 16 on the median but faster in
// only 84 of 150 alternating calls, too close to choose it. 32 contributions ahead takes about 2%
// less time than 16 and 5% less than 8.
constexpr size_t kGradientPrefetchDistance = 12;
constexpr size_t kRowPrefetchDistance = 24;
constexpr int64_t kSumPrefetchContributions = 32;
constexpr int64_t kApplyPrefetchRows = 16;

// The table an update writes, float32 rows in place (Float32Rows) or 16-bit rows (NarrowRows):
// the update reads a 16-bit row into float32, applies the optimizer in float32 and writes the row
// back rounded (RowRounding). Slots are always float32.
struct Float32Rows {
  static constexpr bool kFloat32 = true;
  float* data;
  const void* RowAddress(int64_t row, int64_t dim) const { return data + row * dim; }
  static constexpr int64_t kElementBytes = sizeof(float);
};

// How 16-bit rows are written back: the logical row of a table row (so that the random bits of
// stochastic rounding do not depend on the layout: docs/optimizers.md), the step, and whether the
// pass only checks that every value fits (float16: a dry run before the real one, so that an
// overflow fails the step with nothing written).
struct RowRounding {
  struct Member {         // one member table of the stacked table, by row offset
    int64_t row_offset;   // first row of the member inside each shard
    int64_t rotation;     // shard of the member's logical row 0, in [0, num_shards)
    uint64_t seed;        // the member table's rounding seed
  };
  std::vector<Member> members;  // increasing row_offset; the first at 0
  int64_t num_shards = 1;       // N of the layout (SparseCores x replicas)
  int64_t rows_per_shard = 1;
  int64_t first_local_shard = 0;
  int64_t step = 0;
  bool stochastic = true;
  bool dry_run = false;
  std::atomic<bool>* overflow = nullptr;       // set when a value does not fit (float16)
  std::atomic<int64_t>* overflow_row = nullptr;  // a table row that overflowed

  // The logical row of table row `row` of this variable, and its member's seed.
  int64_t LogicalRow(int64_t row, uint64_t* seed) const {
    const int64_t local_shard = row / rows_per_shard, token = row - local_shard * rows_per_shard;
    return LogicalRowOfMember(MemberOf(token), local_shard, token, seed);
  }
  // The member holding row `token` of a shard: the last with row_offset <= token (a binary
  // search).
  size_t MemberOf(int64_t token) const {
    size_t lo = 0, hi = members.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (members[mid].row_offset <= token) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
  // MemberOf(token) for a token at or after one in member `from`: a walk forward, which the
  // update's rows (increasing tokens) take one member at a time.
  size_t MemberFrom(size_t from, int64_t token) const {
    while (from + 1 < members.size() && members[from + 1].row_offset <= token) ++from;
    return from;
  }
  // The logical row of row `token` of local shard `local_shard`, which member `m` holds, and the
  // member's seed (no division: the update calls it once per row).
  int64_t LogicalRowOfMember(size_t m, int64_t local_shard, int64_t token, uint64_t* seed) const {
    const Member& member = members[m];
    *seed = member.seed;
    const int64_t difference = first_local_shard + local_shard - member.rotation;
    const int64_t residue = difference < 0 ? difference + num_shards : difference;
    return (token - member.row_offset) * num_shards + residue;
  }
};

template <typename Row>
struct NarrowRows {
  static constexpr bool kFloat32 = false;
  using Element = Row;
  Row* data;
  const RowRounding* rounding;
  const void* RowAddress(int64_t row, int64_t dim) const { return data + row * dim; }
  static constexpr int64_t kElementBytes = sizeof(Row);
};

// Row `row` of slot k of a table of width `dim` (SlotRowWidth: dim floats, or one for a row-wise
// slot).
template <typename Optimizer>
__attribute__((always_inline)) inline float* SlotRow(
    const std::array<float*, Optimizer::kSlots.size()>& slots, size_t k, int64_t row,
    int64_t dim) {
  return slots[k] + row * SlotRowWidth(Optimizer::kSlotShapes[k], dim);
}

// Prefetches table row `row` (of width `dim`) and the same row of every slot.
template <typename Optimizer, typename Table>
__attribute__((always_inline)) inline void PrefetchTableRow(
    const Table& table, const std::array<float*, Optimizer::kSlots.size()>& slots, int64_t row,
    int64_t dim) {
  PrefetchRow(table.RowAddress(row, dim), dim * Table::kElementBytes);
  for (size_t k = 0; k < Optimizer::kSlots.size(); ++k) {
    PrefetchRow(SlotRow<Optimizer>(slots, k, row, dim),
                SlotRowWidth(Optimizer::kSlotShapes[k], dim) * static_cast<int64_t>(sizeof(float)));
  }
}

// A row's gradient sum while its contributions are added. With the width fixed at compile time
// (kDim > 0, a multiple of 16) the sum is kDim / 16 vectors of 16 floats, which the compiler keeps
// in registers (zmm with AVX-512, two ymm or four xmm otherwise); GCC does not do that for a
// float array. The arithmetic is the same element-wise sum += gain * g in the same order.
template <int64_t kDim>
struct RowSum {
  static_assert(kDim > 0 && kDim % 16 == 0, "RowSum holds whole vectors of 16 floats");
  typedef float Vec16 __attribute__((vector_size(64)));
  static constexpr int64_t kVecs = kDim / 16;
  Vec16 v[kVecs];
  __attribute__((always_inline)) void Zero(int64_t) {
    for (int64_t k = 0; k < kVecs; ++k) v[k] = Vec16{};
  }
  __attribute__((always_inline)) void Add(const float* g, float gain, int64_t) {
    for (int64_t k = 0; k < kVecs; ++k) {
      Vec16 x;
      std::memcpy(&x, g + 16 * k, sizeof(x));
      v[k] = v[k] + gain * x;
    }
  }
  // Writes the sum to out[0:kDim] / reads it back (exactly).
  __attribute__((always_inline)) void Store(float* out, int64_t) const {
    std::memcpy(out, v, sizeof(v));
  }
  __attribute__((always_inline)) void Load(const float* in, int64_t) {
    std::memcpy(v, in, sizeof(v));
  }
};

// The same for a width known only at run time: the sum is the float buffer `sum`.
struct RuntimeRowSum {
  float* sum;
  __attribute__((always_inline)) void Zero(int64_t dim) { std::fill(sum, sum + dim, 0.0f); }
  __attribute__((always_inline)) void Add(const float* g, float gain, int64_t dim) {
    AccumulateScaled(sum, g, gain, dim);
  }
  __attribute__((always_inline)) void Store(float* out, int64_t dim) const {
    std::copy(sum, sum + dim, out);  // no memcpy: both may be null when dim is 0
  }
  __attribute__((always_inline)) void Load(const float* in, int64_t dim) {
    std::copy(in, in + dim, sum);
  }
};

// With kSkipNonFinite: whether a contribution makes its table row skipped (its activation row holds
// a non-finite value, or its gain is not finite).
__attribute__((always_inline)) inline bool SkipsRow(const uint8_t* bad_activation_rows,
                                                    int64_t activation, float gain) {
  return bad_activation_rows[activation] || !std::isfinite(gain);
}

// Adds one contribution (gradient row `gradient` of activation row `activation`) to a row's sum
// (a RowSum or RuntimeRowSum); with kSkipNonFinite, a contribution that SkipsRow marks the row
// skipped instead.
template <bool kSkipNonFinite, typename Sum>
__attribute__((always_inline)) inline void AddContribution(const float* gradient, int64_t dim,
                                                           int64_t activation, float gain,
                                                           const uint8_t* bad_activation_rows,
                                                           Sum* sum, bool* skip) {
  if (kSkipNonFinite) {
    if (*skip || SkipsRow(bad_activation_rows, activation, gain)) {
      *skip = true;
      return;
    }
  }
  sum->Add(gradient, gain, dim);
}

// The RoundingBits words of row `token` of local shard `local_shard`, held by member `member`
// (RowRounding::MemberOf or MemberFrom), into `words` (FillRoundingWords).
template <typename Row, int64_t kDim>
__attribute__((always_inline)) inline void FillRowRoundingWords(const RowRounding& rounding,
                                                                size_t member, int64_t local_shard,
                                                                int64_t token, int64_t dim,
                                                                uint64_t* words) {
  uint64_t seed;
  const int64_t logical = rounding.LogicalRowOfMember(member, local_shard, token, &seed);
  FillRoundingWords<Row, kDim>(RowRoundingKey(seed, logical, rounding.step), dim, words);
}

// The optimizer step of one 16-bit row: the row read into float32, the optimizer applied, the row
// written back rounded with the bits of (member seed, logical row, column, step) (RoundRow) in
// `words` (FillRowRoundingWords; computed here when null and the rounding is stochastic). A dry
// run works on copies of the row and its slot rows and only records whether a value does not fit.
// kDim > 0 fixes the width at compile time (vector_isa.h): the widened row then lives on the stack
// and the widening, the optimizer and the rounding are loops of whole vectors.
template <typename Optimizer, int64_t kDim, typename Row>
__attribute__((always_inline)) inline void ApplyToNarrowRow(
    int64_t row, const float* sum, int64_t runtime_dim, float learning_rate, const float* hypers,
    const Clip& clip, const NarrowRows<Row>& table, float** slot_rows, const uint64_t* words) {
  constexpr size_t kNumSlots = Optimizer::kSlots.size();
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  const RowRounding& rounding = *table.rounding;
  float fixed_wide[kDim > 0 ? kDim : 1];
  Row fixed_rounded[kDim > 0 ? kDim : 1];
  uint64_t fixed_words[kDim > 0 ? RoundingWords<Row>(kDim) : 1];
  float* wide = fixed_wide;
  Row* rounded = fixed_rounded;
  uint64_t* own_words = fixed_words;
  if constexpr (kDim == 0) {
    thread_local std::vector<float> any_wide;
    thread_local std::vector<Row> any_rounded;
    thread_local std::vector<uint64_t> any_words;
    any_wide.resize(dim);
    any_rounded.resize(dim);
    any_words.resize(RoundingWords<Row>(dim));
    wide = any_wide.data();
    rounded = any_rounded.data();
    own_words = any_words.data();
  }
  if (rounding.stochastic && words == nullptr) {
    const int64_t local_shard = row / rounding.rows_per_shard;
    const int64_t token = row - local_shard * rounding.rows_per_shard;
    FillRowRoundingWords<Row, kDim>(rounding, rounding.MemberOf(token), local_shard, token, dim,
                                    own_words);
    words = own_words;
  }
  if (!rounding.stochastic) words = nullptr;
  Row* stored = table.data + row * dim;
  for (int64_t j = 0; j < dim; ++j) wide[j] = RowValue(stored + j);
  float* slots_used[kNumSlots + 1];
  if (rounding.dry_run) {
    thread_local std::vector<float> slot_copies;
    slot_copies.resize(kNumSlots * dim + 1);
    for (size_t k = 0; k < kNumSlots; ++k) {
      const int64_t width = SlotRowWidth(Optimizer::kSlotShapes[k], dim);
      std::copy(slot_rows[k], slot_rows[k] + width, slot_copies.data() + k * dim);
      slots_used[k] = slot_copies.data() + k * dim;
    }
  } else {
    for (size_t k = 0; k < kNumSlots; ++k) slots_used[k] = slot_rows[k];
  }
  Optimizer::Apply(hypers, learning_rate, sum, wide, slots_used, dim, clip);
  const bool overflow = RoundRow<kDim>(wide, dim, words, rounded);
  if (!rounding.dry_run) std::memcpy(stored, rounded, dim * sizeof(Row));
  if (overflow && rounding.overflow != nullptr) {
    rounding.overflow->store(true);
    if (rounding.overflow_row != nullptr) rounding.overflow_row->store(row);
  }
}

// Applies the optimizer to table row `row` with its summed gradient; returns 1 if it was skipped.
// kDim and `rounding_words` as in ApplyToNarrowRow (a float32 row needs neither: this is inlined
// where dim is known).
template <typename Optimizer, bool kSkipNonFinite, int64_t kDim, typename Table>
__attribute__((always_inline)) inline int64_t FinishRow(
    int64_t row, const float* sum, bool skip, int64_t dim, float learning_rate,
    const float* hypers, const Clip& clip, const Table& table,
    const std::array<float*, Optimizer::kSlots.size()>& slots,
    const uint64_t* rounding_words = nullptr) {
  if (kSkipNonFinite && skip) return 1;
  float* slot_rows[Optimizer::kSlots.size() + 1];
  for (size_t k = 0; k < Optimizer::kSlots.size(); ++k) {
    slot_rows[k] = SlotRow<Optimizer>(slots, k, row, dim);
  }
  if constexpr (Table::kFloat32) {
    Optimizer::Apply(hypers, learning_rate, sum, table.data + row * dim, slot_rows, dim, clip);
  } else {
    ApplyToNarrowRow<Optimizer, kDim>(row, sum, dim, learning_rate, hypers, clip, table,
                                      slot_rows, rounding_words);
  }
  return 0;
}

// One contribution listed for SumListedRows: its gradient row, its gain and the row of the block it
// adds to.
struct ListedContribution {
  const float* gradient;
  float gain;
  int32_t row;
};

// A block lists at most this many contributions (64 KiB of ListedContribution) before they are
// summed; a row with more is continued in the next block. A list of 16,384 is no faster.
constexpr int64_t kListedContributions = 4096;

// The summed gradients of the shard's next referenced rows (at most `capacity`), between the pass
// that sums them and the pass that applies the optimizer to them, and the contributions listed
// for them. Splitting the passes lets each loop prefetch what it alone reads: the summing pass the
// gradient rows, the apply pass the table and slot rows, each ahead in a plain array. In one loop,
// the merge would have to find the next distinct tokens of every run to prefetch their rows; split,
// the fused updates take 12-18% less time (bench/kernel_ab.py; BENCHMARKS.md, "Design
// measurements"). A block holds at most kRowSumBlockBytes of sums and kListedContributions rows
// (1,024 rows at width 32), at least one row, and kListedContributions contributions: its size
// depends on neither the batch nor the table, and it stays in L2 between the passes. Without
// blocks (one pass over the whole shard, then the other) the gain is about half as large; 32 KiB
// blocks are 2.5% slower than 128 KiB, and 512 KiB no faster. Wide rows make few rows per block
// (one from width 16,385), so the apply pass's prefetch has less lead there; widths above 64 are
// not measured.
struct RowSumBlock {
  float* sums;       // [capacity, dim]
  int32_t* tokens;   // row inside the shard, increasing
  uint8_t* skipped;  // 1: a non-finite contribution (kSkipNonFinite only)
  int64_t capacity;
  ListedContribution* list;  // [kListedContributions]
  // 16-bit tables with stochastic rounding: [capacity, RoundingWords(dim)], else null.
  uint64_t* rounding_words;
};
constexpr int64_t kRowSumBlockBytes = int64_t{128} << 10;

// The rows of a RowSumBlock at width `dim`: at least one, and no more than it can list.
inline int64_t RowSumBlockRows(int64_t dim) {
  const int64_t by_bytes =
      kRowSumBlockBytes / (std::max<int64_t>(dim, 1) * static_cast<int64_t>(sizeof(float)));
  return std::max<int64_t>(1, std::min(by_bytes, kListedContributions));
}

// Merges the runs for the shard's next distinct tokens, at most block.capacity of them and at most
// kListedContributions contributions, and returns how many tokens it listed (0 once every run is
// exhausted). Writes their tokens (and, with kSkipNonFinite, whether a contribution SkipsRow) to
// `block` and their contributions, in summation order, to block.list; `*listed` is their count.
// When the list fills up in the middle of a row, that row is the block's last and `*row_cut` is
// set; `continues_row` says that the block's first row continues the previous block's cut row
// (whose skip flag is then in block.skipped[0]). The runs are merged while they are read: the
// smallest head token is the next row; its contributions are listed run by run, each run's in
// position order, which is exactly the order of a stable sort of the runs' concatenation, so the
// sums are bit-identical to the fallback below. Nothing is sorted; the merge reads only the CSR.
// Gradient rows are read by SumListedRows, whose loop has no data-dependent branch but the row
// change, so it can keep many gradient reads in flight (summing in the merge instead makes the
// fused Adagrad update 5-8% slower; BENCHMARKS.md, "Design measurements").
template <bool kSkipNonFinite>
__attribute__((always_inline)) inline int64_t ListNextRows(
    const CsrView& view, ContributionRun* runs, size_t ways,
    const GradientRowAddressing& addressing, const uint8_t* bad_activation_rows,
    const RowSumBlock& block, bool continues_row, int64_t* listed, bool* row_cut) {
  const uint32_t samples_per_sc = static_cast<uint32_t>(view.samples_per_sc());
  ListedContribution* list = block.list;
  int64_t n = 0;
  int64_t rows = 0;
  *row_cut = false;
  while (rows < block.capacity && n < kListedContributions && !*row_cut) {
    int32_t token = kPad;
    for (size_t w = 0; w < ways; ++w) token = std::min(token, runs[w].head_token);
    if (token == kPad) break;
    // A cut row's runs stand where the cut left them: the ones it finished have moved past token.
    bool skip = kSkipNonFinite && rows == 0 && continues_row && block.skipped[0] != 0;
    for (size_t w = 0; w < ways && !*row_cut; ++w) {
      ContributionRun& run = runs[w];
      if (run.head_token != token) continue;
      const uintptr_t* origins = addressing.OriginsOf(run.source_sc);
      while (run.head_token == token) {
        if (n == kListedContributions) {
          *row_cut = true;
          break;
        }
        const int64_t i = run.next;
        const int32_t sample = view.sample_ids[i];
        if (kSkipNonFinite &&
            SkipsRow(bad_activation_rows, run.source_sc * samples_per_sc + sample, view.gains[i])) {
          skip = true;
        }
        list[n++] = {addressing.Row(origins, sample), view.gains[i], static_cast<int32_t>(rows)};
        ++run.next;
        SkipPadding(view, &run);
      }
    }
    block.tokens[rows] = token;
    if (kSkipNonFinite) block.skipped[rows] = skip;
    ++rows;
  }
  *listed = n;
  return rows;
}

// Sums the `listed` contributions of block.list into block.sums, row by row in list order, each
// row from zero, or the first from its partial sum in block.sums[0] when `continues_row`. kDim > 0
// fixes the row width at compile time (it must equal `runtime_dim`): the sum is then held in
// vector registers (RowSum) and the row loops have no remainder. A float array on the stack
// instead, which GCC 12 loads and stores for every contribution, makes the fused Adagrad update
// about 2% slower on the benchmark workload (bench/kernel_ab.py; BENCHMARKS.md, "Design
// measurements"). Stores and loads of a partial sum are exact. The rows of a skipped token are
// summed too, and not used.
template <int64_t kDim>
__attribute__((always_inline)) inline void SumListedRows(const RowSumBlock& block, int64_t listed,
                                                         bool continues_row, int64_t runtime_dim,
                                                         float* runtime_sum) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  typename std::conditional<(kDim > 0), RowSum<kDim>, RuntimeRowSum>::type sum;
  if constexpr (kDim == 0) sum.sum = runtime_sum;
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(float));
  const ListedContribution* e = block.list;
  if (listed == 0) return;
  for (int64_t k = 0; k < std::min(listed, kSumPrefetchContributions); ++k) {
    PrefetchRow(e[k].gradient, row_bytes);
  }
  int32_t row = 0;  // every row of the block has a contribution: rows follow one another
  if (continues_row) {
    sum.Load(block.sums, dim);
  } else {
    sum.Zero(dim);
  }
  for (int64_t k = 0; k < listed; ++k) {
    if (k + kSumPrefetchContributions < listed) {
      PrefetchRow(e[k + kSumPrefetchContributions].gradient, row_bytes);
    }
    if (e[k].row != row) {
      sum.Store(block.sums + row * dim, dim);
      sum.Zero(dim);
      row = e[k].row;
    }
    sum.Add(e[k].gradient, e[k].gain, dim);
  }
  sum.Store(block.sums + row * dim, dim);
}

// Applies the optimizer to the first `rows` rows of `block` (table rows shard_row + token) and
// returns how many it skipped. For a 16-bit table with stochastic rounding, the rows' random bits
// are hashed first, in one loop over the block that knows the shard (no division per row for the
// logical row); hashing in the row loop with a division per row made the bfloat16 update 2-4%
// slower (bench/kernel_ab.py --kernel adagrad-bf16; BENCHMARKS.md, "Design measurements").
template <typename Optimizer, bool kSkipNonFinite, int64_t kDim, typename Table>
__attribute__((always_inline)) inline int64_t ApplyRowSums(
    const RowSumBlock& block, int64_t rows, int64_t shard_row, int64_t dim, float learning_rate,
    const float* hypers, const Clip& clip, const Table& table,
    const std::array<float*, Optimizer::kSlots.size()>& slots) {
  for (int64_t r = 0; r < std::min(rows, kApplyPrefetchRows); ++r) {
    PrefetchTableRow<Optimizer>(table, slots, shard_row + block.tokens[r], dim);
  }
  int64_t words_per_row = 0;
  if constexpr (!Table::kFloat32) {
    using Row = typename Table::Element;
    if (block.rounding_words != nullptr) {
      words_per_row = RoundingWords<Row>(dim);
      const RowRounding& rounding = *table.rounding;
      const int64_t local_shard = shard_row / rounding.rows_per_shard;
      size_t member = rows > 0 ? rounding.MemberOf(block.tokens[0]) : 0;
      for (int64_t r = 0; r < rows; ++r) {
        member = rounding.MemberFrom(member, block.tokens[r]);
        FillRowRoundingWords<Row, kDim>(rounding, member, local_shard, block.tokens[r], dim,
                                        block.rounding_words + r * words_per_row);
      }
    }
  }
  int64_t skipped = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kApplyPrefetchRows < rows) {
      PrefetchTableRow<Optimizer>(table, slots, shard_row + block.tokens[r + kApplyPrefetchRows],
                                  dim);
    }
    skipped += FinishRow<Optimizer, kSkipNonFinite, kDim>(
        shard_row + block.tokens[r], block.sums + r * dim, kSkipNonFinite && block.skipped[r],
        dim, learning_rate, hypers, clip, table, slots,
        words_per_row > 0 ? block.rounding_words + r * words_per_row : nullptr);
  }
  return skipped;
}

// The update of one shard whose contributions are sorted runs (FindSortedRuns), block by block: the
// next rows' contributions listed (ListNextRows), summed (SumListedRows), then the rows updated
// (ApplyRowSums). A row cut by a full list is carried to the next block and updated once whole.
template <typename Optimizer, bool kSkipNonFinite, int64_t kDim, typename Table>
__attribute__((always_inline)) inline int64_t UpdateShardFromRuns(
    const CsrView& view, ContributionRun* runs, size_t ways, int64_t shard_row,
    const GradientRows& grads, int64_t runtime_dim, float learning_rate, const float* hypers,
    const Clip& clip, const Table& table, const std::array<float*, Optimizer::kSlots.size()>& slots,
    const uint8_t* bad_activation_rows, float* runtime_sum, const RowSumBlock& block) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  const GradientRowAddressing addressing = grads.Addressing();  // held in registers
  int64_t skipped = 0;
  bool continues_row = false;
  for (;;) {
    int64_t listed = 0;
    bool row_cut = false;
    const int64_t rows = ListNextRows<kSkipNonFinite>(view, runs, ways, addressing,
                                                      bad_activation_rows, block, continues_row,
                                                      &listed, &row_cut);
    if (rows == 0) break;
    SumListedRows<kDim>(block, listed, continues_row, dim, runtime_sum);
    // A cut row is updated once it is whole: its partial sum and skip flag move to row 0.
    const int64_t whole = row_cut ? rows - 1 : rows;
    skipped += ApplyRowSums<Optimizer, kSkipNonFinite, kDim>(block, whole, shard_row, dim,
                                                       learning_rate, hypers, clip, table, slots);
    if (row_cut && whole > 0) {  // (the next ListNextRows writes the token again)
      std::copy(block.sums + whole * dim, block.sums + rows * dim, block.sums);
      if (kSkipNonFinite) block.skipped[0] = block.skipped[whole];
    }
    continues_row = row_cut;
  }
  return skipped;
}

// The gradient row of a collected contribution.
__attribute__((always_inline)) inline const float* ContributionGradient(
    const GradientRowAddressing& addressing, int64_t samples_per_sc, const RowContribution& e) {
  return addressing.Row(e.source_sc, e.activation - int64_t{e.source_sc} * samples_per_sc);
}

// The fallback: the shard's contributions collected and sorted (CollectShardContributions), then
// summed row by row in that order.
template <typename Optimizer, bool kSkipNonFinite, typename Table>
__attribute__((always_inline)) inline int64_t UpdateShardFromSortedContributions(
    const std::vector<RowContribution>& entries, int64_t shard_row, const GradientRows& grads,
    int64_t samples_per_sc, int64_t dim, float learning_rate, const float* hypers,
    const Clip& clip, const Table& table,
    const std::array<float*, Optimizer::kSlots.size()>& slots, const uint8_t* bad_activation_rows,
    float* sum) {
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(float));
  const size_t n = entries.size();
  const GradientRowAddressing addressing = grads.Addressing();  // held in registers
  int64_t skipped = 0;
  for (size_t i = 0; i < n;) {
    const int32_t token = entries[i].token;
    RuntimeRowSum row_sum{sum};
    row_sum.Zero(dim);
    bool skip = false;
    for (; i < n && entries[i].token == token; ++i) {
      if (i + kGradientPrefetchDistance < n) {
        PrefetchRow(
            ContributionGradient(addressing, samples_per_sc,
                                 entries[i + kGradientPrefetchDistance]),
            row_bytes);
      }
      if (i + kRowPrefetchDistance < n &&
          entries[i + kRowPrefetchDistance].token != entries[i + kRowPrefetchDistance - 1].token) {
        PrefetchTableRow<Optimizer>(table, slots,
                                    shard_row + entries[i + kRowPrefetchDistance].token, dim);
      }
      AddContribution<kSkipNonFinite>(ContributionGradient(addressing, samples_per_sc, entries[i]),
                                      dim, entries[i].activation, entries[i].gain,
                                      bad_activation_rows, &row_sum, &skip);
    }
    skipped += FinishRow<Optimizer, kSkipNonFinite, 0>(shard_row + token, sum, skip, dim,
                                                    learning_rate, hypers, clip, table, slots);
  }
  return skipped;
}

// The update of local shards [p_begin, p_end): one shard at a time, rows in token order, summed
// block by block (RowSumBlock), then one optimizer step per row. Always inlined into one function
// per instruction set (UpdateShardsAvx512 / UpdateShardsAvx2 / UpdateShardsBaseline), so the
// accumulation and the optimizer's per-row math are vectorized as widely as the CPU allows; the
// arithmetic is the same element-wise operations in the same order (no FMA contraction:
// -ffp-contract=off), so all versions give bit-identical results.
template <typename Optimizer, bool kSkipNonFinite, typename Table>
__attribute__((always_inline)) inline int64_t UpdateShards(
    const CsrView& view, const GradientRows& grads, int64_t dim, float learning_rate,
    const float* hypers, const Clip& clip, const Table& table,
    const std::array<float*, Optimizer::kSlots.size()>& slots,
    const uint8_t* bad_activation_rows, int64_t p_begin, int64_t p_end) {
  thread_local std::vector<ContributionRun> runs;
  thread_local std::vector<RowContribution> entries;
  thread_local std::vector<float> sum;
  thread_local std::vector<float> block_sums;
  thread_local std::vector<int32_t> block_tokens;
  thread_local std::vector<uint8_t> block_skipped;
  thread_local std::vector<ListedContribution> block_list(kListedContributions);
  thread_local std::vector<uint64_t> block_rounding_words;
  sum.resize(dim);
  const int64_t block_rows = RowSumBlockRows(dim);
  block_sums.resize(block_rows * dim);  // at most kRowSumBlockBytes, or one row
  block_tokens.resize(block_rows);
  block_skipped.resize(block_rows);
  uint64_t* rounding_words = nullptr;
  if constexpr (!Table::kFloat32) {
    using Row = typename Table::Element;
    if (table.rounding->stochastic) {
      block_rounding_words.resize(block_rows * RoundingWords<Row>(dim));
      rounding_words = block_rounding_words.data();
    }
  }
  const RowSumBlock block{block_sums.data(), block_tokens.data(), block_skipped.data(),
                          block_rows, block_list.data(), rounding_words};
  int64_t skipped = 0;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t shard = view.first_local_shard + p;
    const int64_t shard_row = p * view.rows_per_shard();
    if (FindSortedRuns(view, shard, &runs)) {
      // The common widths get a version with the width fixed at compile time (vector_isa.h).
#define SCE_UPDATE_SHARD_FROM_RUNS(kDim)                                                      \
  UpdateShardFromRuns<Optimizer, kSkipNonFinite, kDim>(view, runs.data(), runs.size(),         \
                                                       shard_row, grads, dim, learning_rate,   \
                                                       hypers, clip, table, slots,             \
                                                       bad_activation_rows, sum.data(), block)
      switch (RowWidthBuild(dim)) {
        case 0: skipped += SCE_UPDATE_SHARD_FROM_RUNS(kFixedRowWidths[0]); break;
        case 1: skipped += SCE_UPDATE_SHARD_FROM_RUNS(kFixedRowWidths[1]); break;
        case 2: skipped += SCE_UPDATE_SHARD_FROM_RUNS(kFixedRowWidths[2]); break;
        default: skipped += SCE_UPDATE_SHARD_FROM_RUNS(0); break;
      }
#undef SCE_UPDATE_SHARD_FROM_RUNS
    } else {
      CollectShardContributions(view, shard, &entries);
      skipped += UpdateShardFromSortedContributions<Optimizer, kSkipNonFinite>(
          entries, shard_row, grads, view.samples_per_sc(), dim, learning_rate, hypers, clip,
          table, slots, bad_activation_rows, sum.data());
    }
  }
  return skipped;
}

// One out-of-line copy of UpdateShards per instruction set (the same body, compiled for `target`).
#define SCE_DEFINE_UPDATE_SHARDS(name, target)                                                    \
  template <typename Optimizer, bool kSkipNonFinite, typename Table>                             \
  target int64_t name(const CsrView& view, const GradientRows& grads, int64_t dim,                \
                      float learning_rate, const float* hypers, const Clip& clip,                \
                      const Table& table,                                                        \
                      const std::array<float*, Optimizer::kSlots.size()>& slots,                 \
                      const uint8_t* bad_activation_rows, int64_t p_begin, int64_t p_end) {      \
    return UpdateShards<Optimizer, kSkipNonFinite>(view, grads, dim, learning_rate, hypers,      \
                                                   clip, table, slots, bad_activation_rows,      \
                                                   p_begin, p_end);                              \
  }
SCE_DEFINE_UPDATE_SHARDS(UpdateShardsAvx512, SCE_TARGET_AVX512)
SCE_DEFINE_UPDATE_SHARDS(UpdateShardsAvx2, SCE_TARGET_AVX2)
SCE_DEFINE_UPDATE_SHARDS(UpdateShardsBaseline, )
#undef SCE_DEFINE_UPDATE_SHARDS

// `view` must have passed ValidateCsrView; `grads` gives every activation row's gradient (dim
// floats; see activation_rows.h); `table` holds [view.table_rows, dim] rows (Float32Rows or
// NarrowRows) and every `slots[i]` is [view.table_rows, SlotRowWidth(kSlotShapes[i], dim)];
// they are updated in place.
//
// With `bad_activation_rows` null (every gradient and gain is finite: the normal case) this is the
// plain fused update. Otherwise a table row that any contribution with a flagged activation row or
// a non-finite gain would touch is left unchanged (table and slots), and the number of such rows is
// returned. `isa` picks the instruction set (default: the widest the CPU has; the results are the
// same, see UpdateShards); one the CPU lacks runs as UsableIsa says.
template <typename Optimizer, bool kSkipNonFinite, typename Table>
int64_t FusedUpdateImpl(const CsrView& view, const GradientRows& grads, int64_t dim,
                        float learning_rate, const float* hypers, const Clip& clip,
                        const Table& table,
                        const std::array<float*, Optimizer::kSlots.size()>& slots,
                        const uint8_t* bad_activation_rows, const ParallelFor& parallel_for,
                        VectorIsa isa) {
  // The build of the update loop for `isa` (one function per instruction set, same signature).
  auto* update_shards = &UpdateShardsBaseline<Optimizer, kSkipNonFinite, Table>;
  isa = UsableIsa(isa);
  if (isa == VectorIsa::kAvx2) update_shards = &UpdateShardsAvx2<Optimizer, kSkipNonFinite, Table>;
  if (isa == VectorIsa::kAvx512) {
    update_shards = &UpdateShardsAvx512<Optimizer, kSkipNonFinite, Table>;
  }
  std::atomic<int64_t> skipped{0};
  const int64_t cost = SaturatingMul(
      SaturatingMul(200, view.num_token_ids / view.num_shards() + 1), std::max<int64_t>(dim, 1));
  // Shards own disjoint table rows, so they are updated in parallel without locks.
  parallel_for(view.local_shards(), cost, [&](int64_t p_begin, int64_t p_end) {
    const int64_t local_skipped =
        update_shards(view, grads, dim, learning_rate, hypers, clip, table, slots,
                      bad_activation_rows, p_begin, p_end);
    if (local_skipped > 0) skipped += local_skipped;
  });
  return skipped.load();
}

template <typename Optimizer, typename Table>
int64_t FusedUpdateOf(const CsrView& view, const GradientRows& grads, int64_t dim,
                      float learning_rate, const float* hypers, const Clip& clip,
                      const Table& table,
                      const std::array<float*, Optimizer::kSlots.size()>& slots,
                      const ParallelFor& parallel_for, const uint8_t* bad_activation_rows,
                      VectorIsa isa) {
  if (bad_activation_rows == nullptr) {
    return FusedUpdateImpl<Optimizer, false>(view, grads, dim, learning_rate, hypers, clip, table,
                                             slots, nullptr, parallel_for, isa);
  }
  return FusedUpdateImpl<Optimizer, true>(view, grads, dim, learning_rate, hypers, clip, table,
                                          slots, bad_activation_rows, parallel_for, isa);
}

// The fused update of a float32 table.
template <typename Optimizer>
int64_t FusedUpdate(const CsrView& view, const GradientRows& grads, int64_t dim,
                    float learning_rate, const float* hypers, const Clip& clip, float* table,
                    const std::array<float*, Optimizer::kSlots.size()>& slots,
                    const ParallelFor& parallel_for,
                    const uint8_t* bad_activation_rows = nullptr,
                    VectorIsa isa = BestVectorIsa()) {
  return FusedUpdateOf<Optimizer>(view, grads, dim, learning_rate, hypers, clip,
                                  Float32Rows{table}, slots, parallel_for, bad_activation_rows,
                                  isa);
}

// The fused update of a 16-bit table (Row: Bfloat16 or Float16), rows written back as `rounding`
// says (its dry_run, overflow and overflow_row are set here). A float16 table is first updated in
// a dry run; if a value does not fit, nothing is written and *overflow_row is a table row that
// overflowed (the return value is then -1). Otherwise returns the rows skipped, as FusedUpdate.
template <typename Optimizer, typename Row>
int64_t FusedUpdateNarrow(const CsrView& view, const GradientRows& grads, int64_t dim,
                          float learning_rate, const float* hypers, const Clip& clip, Row* table,
                          RowRounding rounding,
                          const std::array<float*, Optimizer::kSlots.size()>& slots,
                          const ParallelFor& parallel_for, const uint8_t* bad_activation_rows,
                          int64_t* overflow_row, VectorIsa isa = BestVectorIsa()) {
  std::atomic<bool> overflow{false};
  std::atomic<int64_t> row{-1};
  rounding.overflow = &overflow;
  rounding.overflow_row = &row;
  rounding.rows_per_shard = view.rows_per_shard();
  rounding.first_local_shard = view.first_local_shard;
  for (RowRounding::Member& member : rounding.members) member.rotation %= rounding.num_shards;
  if (std::is_same<Row, Float16>::value) {
    rounding.dry_run = true;
    FusedUpdateOf<Optimizer>(view, grads, dim, learning_rate, hypers, clip,
                             NarrowRows<Row>{table, &rounding}, slots, parallel_for,
                             bad_activation_rows, isa);
    if (overflow.load()) {
      *overflow_row = row.load();
      return -1;
    }
  }
  rounding.dry_run = false;
  return FusedUpdateOf<Optimizer>(view, grads, dim, learning_rate, hypers, clip,
                                  NarrowRows<Row>{table, &rounding}, slots, parallel_for,
                                  bad_activation_rows, isa);
}

}  // namespace sce

#endif  // SCE_CORE_FUSED_UPDATE_H_
