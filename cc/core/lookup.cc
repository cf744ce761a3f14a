#include "cc/core/lookup.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cc/core/avx512.h"
#include "cc/core/checked_math.h"
#include "cc/core/sample_major_order.h"

namespace sce {

Status ValidateQuantization(const Quantization& q, const std::string& table_name) {
  if (q.num_buckets == 0) return Status::Ok();
  if (q.num_buckets < 2 || !(q.low < q.high) || !std::isfinite(q.low) || !std::isfinite(q.high) ||
      !std::isfinite(q.high - q.low)) {
    return InvalidArgument("table '", table_name,
                           "': quantization needs num_buckets >= 2 and finite low < high; got "
                           "num_buckets ",
                           q.num_buckets, ", low ", q.low, ", high ", q.high);
  }
  return Status::Ok();
}

namespace {

inline float Quantize(float v, float low, float high, float quantum) {
  v = std::min(std::max(v, low), high);
  return std::floor((v - low) / quantum + 0.5f) * quantum + low;
}

// Sums one segment's gain-weighted rows into the activation block, in buffer order: the loop for
// tables beyond SampleMajorOrder's row index and for LookupLoop::kInBufferOrder (tests; the
// sample-major loop below gives the same bits). Every version adds the same
// products in the same order (no FMA contraction), so the activations are bit-identical. Upcoming
// table rows and activation rows are prefetched: both are read at random (entries are sorted by
// row, samples are not). Sample i of the segment's source SparseCore goes to row out_rows[i] of
// `activations`, or to row first_row + i when out_rows is null (SparseCore-major order).
// kDim > 0 fixes the row width at compile time (it must equal `runtime_dim`), so a row is whole
// vectors with no remainder loop.
template <typename Row, int64_t kDim>
__attribute__((always_inline)) inline void AccumulateSegmentBody(
    const CsrView& view, int64_t begin, int64_t end, const Row* shard, int64_t runtime_dim,
    float* activations, int64_t first_row, const int32_t* out_rows) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  // A table row may be narrower than its float32 activation row (16-bit rows take half the lines),
  // so each is prefetched by its own line count.
  const int64_t table_lines = (dim * static_cast<int64_t>(sizeof(Row)) + 63) / 64;
  const int64_t activation_lines = (dim * static_cast<int64_t>(sizeof(float)) + 63) / 64;
  // Measured with bench/kernel_ab.py on the benchmark workload (4M-row caps): on the 2-core
  // machine S, 16 beat 8 by 5-6% and 12 or 24 by about 1%; on a later AMD EPYC machine with
  // AVX-512, against 16, float32 rows take 13% less time at 32, 17% at 48, 19% at 64 and 20% at
  // 96, bfloat16 rows 9%, 13%, 15% and 15%. 48 takes most of that gain with fewer misses in
  // flight, for CPUs with fewer fill buffers.
  constexpr int64_t kPrefetchDistance = 48;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
    if (token == kPad || sample == kPad) continue;
    if (i + kPrefetchDistance < end && view.token_ids[i + kPrefetchDistance] != kPad &&
        view.sample_ids[i + kPrefetchDistance] != kPad) {
      const char* ahead = reinterpret_cast<const char*>(
          shard + static_cast<int64_t>(view.token_ids[i + kPrefetchDistance]) * dim);
      const int32_t sample_ahead = view.sample_ids[i + kPrefetchDistance];
      const char* out_ahead = reinterpret_cast<const char*>(
          activations + (out_rows ? out_rows[sample_ahead] : first_row + sample_ahead) * dim);
      for (int64_t line = 0; line < table_lines; ++line) __builtin_prefetch(ahead + 64 * line);
      for (int64_t line = 0; line < activation_lines; ++line) {
        __builtin_prefetch(out_ahead + 64 * line, 1);
      }
    }
    const float gain = view.gains[i];
    const Row* row = shard + static_cast<int64_t>(token) * dim;
    float* out = activations + (out_rows ? out_rows[sample] : first_row + sample) * dim;
    for (int64_t j = 0; j < dim; ++j) out[j] += gain * RowValue(row + j);
  }
}

// One out-of-line build of AccumulateSegmentBody per instruction set (the same body, compiled
// for `target`), each for the common widths fixed at compile time and for any width.
#define SCE_DEFINE_ACCUMULATE_SEGMENT(name, target)                                           \
  template <typename Row, int64_t kDim>                                                      \
  target void name(const CsrView& view, int64_t begin, int64_t end, const Row* shard,         \
                   int64_t dim, float* activations, int64_t first_row,                       \
                   const int32_t* out_rows) {                                                \
    AccumulateSegmentBody<Row, kDim>(view, begin, end, shard, dim, activations, first_row,    \
                                     out_rows);                                              \
  }
SCE_DEFINE_ACCUMULATE_SEGMENT(AccumulateSegmentAvx512, SCE_TARGET_AVX512)
SCE_DEFINE_ACCUMULATE_SEGMENT(AccumulateSegmentAvx2, SCE_TARGET_AVX2)
SCE_DEFINE_ACCUMULATE_SEGMENT(AccumulateSegmentBaseline, )
#undef SCE_DEFINE_ACCUMULATE_SEGMENT

// Sums the table rows of each sample of one source SparseCore, grouped by SampleMajorOrder, and
// stores each activation row once: sample i goes to row out_rows[i] of `activations`, or to row
// first_row + i when out_rows is null. The sum starts at +0 and adds the products in the order
// AccumulateSegmentBody would, so the bits are the same. Only the table rows are read at random;
// the one of the entry kSampleMajorPrefetchDistance ahead is prefetched (lookup.h).
template <typename Row, int64_t kDim>
__attribute__((always_inline)) inline void AccumulateSamplesBody(
    const SampleMajorEntries& entries, int64_t num_samples, const Row* table,
    int64_t runtime_dim, float* activations, int64_t first_row, const int32_t* out_rows) {
  const int64_t dim = kDim > 0 ? kDim : runtime_dim;
  const int32_t* sample_begin = entries.sample_begin;
  const uint32_t* rows = entries.rows;
  const float* gains = entries.gains;
  const int64_t num_entries = sample_begin[num_samples];
  // A fixed-width sum is a local array, which the compiler keeps in vector registers; a width
  // read at run time sums into the activation row itself (it stays in L1 while the sample lasts).
  float local[kDim > 0 ? kDim : 1];
  for (int64_t i = 0; i < num_samples; ++i) {
    float* out = activations + (out_rows ? out_rows[i] : first_row + i) * dim;
    float* sum = kDim > 0 ? local : out;
    for (int64_t j = 0; j < dim; ++j) sum[j] = 0.0f;
    for (int64_t k = sample_begin[i]; k < sample_begin[i + 1]; ++k) {
      PrefetchRowAhead(rows, k, num_entries, table, dim);
      const float gain = gains[k];
      const Row* row = table + static_cast<int64_t>(rows[k]) * dim;
      for (int64_t j = 0; j < dim; ++j) sum[j] += gain * RowValue(row + j);
    }
    if (kDim > 0) std::memcpy(out, local, sizeof(float) * dim);
  }
}

#define SCE_DEFINE_ACCUMULATE_SAMPLES(name, target)                                          \
  template <typename Row, int64_t kDim>                                                      \
  target void name(const SampleMajorEntries& entries, int64_t num_samples, const Row* table,  \
                   int64_t dim, float* activations, int64_t first_row,                       \
                   const int32_t* out_rows) {                                                \
    AccumulateSamplesBody<Row, kDim>(entries, num_samples, table, dim, activations, first_row, \
                                     out_rows);                                              \
  }
SCE_DEFINE_ACCUMULATE_SAMPLES(AccumulateSamplesAvx512, SCE_TARGET_AVX512)
SCE_DEFINE_ACCUMULATE_SAMPLES(AccumulateSamplesAvx2, SCE_TARGET_AVX2)
SCE_DEFINE_ACCUMULATE_SAMPLES(AccumulateSamplesBaseline, )
#undef SCE_DEFINE_ACCUMULATE_SAMPLES

#if defined(__x86_64__)
SCE_AVX512_CODE_BEGIN
// AccumulateSamplesBody for bfloat16 rows of a width that is whole 64-byte lines (kDim 32 or 64),
// by hand. A 32-bit lane of a line holds columns 2i (low half) and 2i + 1 (high half); shifted
// left by 16 and masked to its high half they are those columns as float32, so a line becomes two
// vectors of float32 with one shift and one AND, where widening each half costs a shuffle and a
// shift. The two sums (even and odd columns) are interleaved once per sample, when the row is
// stored. Each column gets the same products added in the same order as in the generic loop, so
// the bits are the same; fewer instructions per entry leave more entries' reads in flight.
template <int64_t kDim>
SCE_TARGET_AVX512 void AccumulateBfloat16SamplesAvx512(
    const SampleMajorEntries& entries, int64_t num_samples, const Bfloat16* table,
    int64_t /*dim*/, float* activations, int64_t first_row, const int32_t* out_rows) {
  static_assert(kDim > 0 && kDim % 32 == 0, "whole 64-byte lines of bfloat16");
  constexpr int kLines = static_cast<int>(kDim / 32);
  const int32_t* sample_begin = entries.sample_begin;
  const uint32_t* rows = entries.rows;
  const float* gains = entries.gains;
  const int64_t num_entries = sample_begin[num_samples];
  const __m512i high_half = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  // Lane k of the first interleaved vector takes even[k / 2] or odd[k / 2]; the second, the same
  // eight lanes further on (_mm512_permutex2var_ps: indices 16 and up name the second operand).
  const __m512i first_half = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                               7, 23);
  const __m512i second_half = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14,
                                                30, 15, 31);
  for (int64_t i = 0; i < num_samples; ++i) {
    __m512 even[kLines], odd[kLines];
    for (int c = 0; c < kLines; ++c) even[c] = odd[c] = _mm512_setzero_ps();
    for (int64_t k = sample_begin[i]; k < sample_begin[i + 1]; ++k) {
      PrefetchRowAhead(rows, k, num_entries, table, kDim);
      const __m512 gain = _mm512_set1_ps(gains[k]);
      const Bfloat16* row = table + static_cast<int64_t>(rows[k]) * kDim;
      for (int c = 0; c < kLines; ++c) {
        const __m512i line = _mm512_loadu_si512(row + 32 * c);
        const __m512 low = _mm512_castsi512_ps(_mm512_slli_epi32(line, 16));
        const __m512 high = _mm512_castsi512_ps(_mm512_and_si512(line, high_half));
        even[c] = _mm512_add_ps(even[c], _mm512_mul_ps(gain, low));
        odd[c] = _mm512_add_ps(odd[c], _mm512_mul_ps(gain, high));
      }
    }
    float* out = activations + (out_rows ? out_rows[i] : first_row + i) * kDim;
    for (int c = 0; c < kLines; ++c) {
      _mm512_storeu_ps(out + 32 * c, _mm512_permutex2var_ps(even[c], first_half, odd[c]));
      _mm512_storeu_ps(out + 32 * c + 16, _mm512_permutex2var_ps(even[c], second_half, odd[c]));
    }
  }
}
SCE_AVX512_CODE_END

// AccumulateSamplesBody for float32 and bfloat16 rows of the fixed widths, by hand for AVX2.
// Built from the generic body for AVX2, GCC 12 zeroes each activation row's sum with `rep stos`
// and copies it out through the stack in 16-byte pieces, once per activation row. Here the sums
// stay in registers and are stored once: 30% less time with either dtype (bench/kernel_ab.py with
// the ISA patched; BENCHMARKS.md, "Design measurements"). A bfloat16 chunk of 16 columns is split
// into even and odd columns with a shift and a mask as in the AVX-512 loop above, and interleaved
// when stored. The products are added in the generic loop's order, so the bits are the same.
template <typename Row, int64_t kDim>
SCE_TARGET_AVX2 void AccumulateSamplesByHandAvx2(const SampleMajorEntries& entries,
                                                 int64_t num_samples, const Row* table,
                                                 int64_t /*dim*/, float* activations,
                                                 int64_t first_row, const int32_t* out_rows) {
  static_assert(kDim > 0 && kDim % 16 == 0, "whole 16-column chunks");
  constexpr bool kBfloat16 = std::is_same<Row, Bfloat16>::value;
  static_assert(kBfloat16 || std::is_same<Row, float>::value, "float32 or bfloat16 rows");
  constexpr int kSums = static_cast<int>(kDim / 8);  // 8 float32 columns (or 8 even or odd) each
  const int32_t* sample_begin = entries.sample_begin;
  const uint32_t* rows = entries.rows;
  const float* gains = entries.gains;
  const int64_t num_entries = sample_begin[num_samples];
  const __m256i high_half = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t i = 0; i < num_samples; ++i) {
    __m256 sum[kSums];
    for (int v = 0; v < kSums; ++v) sum[v] = _mm256_setzero_ps();
    for (int64_t k = sample_begin[i]; k < sample_begin[i + 1]; ++k) {
      PrefetchRowAhead(rows, k, num_entries, table, kDim);
      const __m256 gain = _mm256_set1_ps(gains[k]);
      const Row* row = table + static_cast<int64_t>(rows[k]) * kDim;
      if constexpr (kBfloat16) {
        for (int c = 0; c < kSums / 2; ++c) {  // sum[2c]: even columns of chunk c; sum[2c + 1]: odd
          const __m256i chunk =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * c));
          const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(chunk, 16));
          const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(chunk, high_half));
          sum[2 * c] = _mm256_add_ps(sum[2 * c], _mm256_mul_ps(gain, even));
          sum[2 * c + 1] = _mm256_add_ps(sum[2 * c + 1], _mm256_mul_ps(gain, odd));
        }
      } else {
        for (int v = 0; v < kSums; ++v) {
          sum[v] = _mm256_add_ps(sum[v], _mm256_mul_ps(gain, _mm256_loadu_ps(row + 8 * v)));
        }
      }
    }
    float* out = activations + (out_rows ? out_rows[i] : first_row + i) * kDim;
    if constexpr (kBfloat16) {
      for (int c = 0; c < kSums / 2; ++c) {
        // Per 128-bit half: columns 0-3 and 8-11 of the chunk, then 4-7 and 12-15.
        const __m256 low = _mm256_unpacklo_ps(sum[2 * c], sum[2 * c + 1]);
        const __m256 high = _mm256_unpackhi_ps(sum[2 * c], sum[2 * c + 1]);
        _mm256_storeu_ps(out + 16 * c, _mm256_permute2f128_ps(low, high, 0x20));
        _mm256_storeu_ps(out + 16 * c + 8, _mm256_permute2f128_ps(low, high, 0x31));
      }
    } else {
      for (int v = 0; v < kSums; ++v) _mm256_storeu_ps(out + 8 * v, sum[v]);
    }
  }
}
#endif

template <typename Row>
using AccumulateSegmentFn = void (*)(const CsrView&, int64_t, int64_t, const Row*, int64_t,
                                     float*, int64_t, const int32_t*);

// The builds of a row loop template `fn<Row, kDim>` in RowWidthBuild's order.
#define SCE_ROW_TYPE_WIDTH_BUILDS(fn, Row)                                                 \
  {                                                                                      \
    &fn<Row, ::sce::kFixedRowWidths[0]>, &fn<Row, ::sce::kFixedRowWidths[1]>,            \
        &fn<Row, ::sce::kFixedRowWidths[2]>, &fn<Row, 0>                                 \
  }

// The builds of the row loop templates `prefix##Baseline`, `##Avx2` and `##Avx512` in
// SelectRowLoopBuild's order.
#define SCE_ISA_ROW_WIDTH_BUILDS(prefix, Row)                                              \
  {                                                                                      \
    SCE_ROW_TYPE_WIDTH_BUILDS(prefix##Baseline, Row),                                    \
        SCE_ROW_TYPE_WIDTH_BUILDS(prefix##Avx2, Row),                                    \
        SCE_ROW_TYPE_WIDTH_BUILDS(prefix##Avx512, Row)                                   \
  }

// The build of the accumulation loop for `isa` and `dim`. With the width fixed at compile time
// the forward lookup of the benchmark workload takes 25-28% less time, with the same bits
// (bench/kernel_ab.py --kernel forward; BENCHMARKS.md, "Design measurements").
template <typename Row>
AccumulateSegmentFn<Row> AccumulateSegmentFor(VectorIsa isa, int64_t dim) {
  static constexpr AccumulateSegmentFn<Row> kBuilds[3][4] =
      SCE_ISA_ROW_WIDTH_BUILDS(AccumulateSegment, Row);
  return SelectRowLoopBuild(kBuilds, isa, dim);
}

template <typename Row>
using AccumulateSamplesFn = void (*)(const SampleMajorEntries&, int64_t, const Row*, int64_t,
                                     float*, int64_t, const int32_t*);

// The hand-written sample-major loop for `isa` (as UsableIsa gives it), row type and width, or
// null where the generic builds serve: AVX-512 for bfloat16 rows of 32 or 64 columns, AVX2 for
// float32 and bfloat16 rows of the fixed widths (kFixedRowWidths).
template <typename Row>
AccumulateSamplesFn<Row> AccumulateSamplesByHand(VectorIsa isa, int64_t dim) {
#if defined(__x86_64__)
  constexpr bool kBfloat16 = std::is_same<Row, Bfloat16>::value;
  if constexpr (kBfloat16) {
    if (isa == VectorIsa::kAvx512 && dim == 32) return &AccumulateBfloat16SamplesAvx512<32>;
    if (isa == VectorIsa::kAvx512 && dim == 64) return &AccumulateBfloat16SamplesAvx512<64>;
  }
  if constexpr (kBfloat16 || std::is_same<Row, float>::value) {
    static constexpr AccumulateSamplesFn<Row> kAvx2Builds[3] = {
        &AccumulateSamplesByHandAvx2<Row, kFixedRowWidths[0]>,
        &AccumulateSamplesByHandAvx2<Row, kFixedRowWidths[1]>,
        &AccumulateSamplesByHandAvx2<Row, kFixedRowWidths[2]>};
    if (isa == VectorIsa::kAvx2 && RowWidthBuild(dim) < 3) return kAvx2Builds[RowWidthBuild(dim)];
  }
#endif
  (void)isa;
  (void)dim;
  return nullptr;
}

template <typename Row>
AccumulateSamplesFn<Row> AccumulateSamplesFor(VectorIsa isa, int64_t dim) {
  const AccumulateSamplesFn<Row> by_hand = AccumulateSamplesByHand<Row>(UsableIsa(isa), dim);
  if (by_hand != nullptr) return by_hand;
  static constexpr AccumulateSamplesFn<Row> kBuilds[3][4] =
      SCE_ISA_ROW_WIDTH_BUILDS(AccumulateSamples, Row);
  return SelectRowLoopBuild(kBuilds, isa, dim);
}

template <typename Row>
void AccumulateQuantizedSegment(const CsrView& view, int64_t begin, int64_t end,
                                const Row* shard, int64_t dim, const Quantization& q,
                                float quantum, float* activations, int64_t first_row,
                                const int32_t* out_rows) {
  for (int64_t i = begin; i < end; ++i) {
    const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
    if (token == kPad || sample == kPad) continue;
    const float gain = view.gains[i];
    const Row* row = shard + static_cast<int64_t>(token) * dim;
    float* out = activations + (out_rows ? out_rows[sample] : first_row + sample) * dim;
    for (int64_t j = 0; j < dim; ++j) {
      out[j] += gain * Quantize(RowValue(row + j), q.low, q.high, quantum);
    }
  }
}

}  // namespace

template <typename Row>
void SparseDenseMatmul(const CsrView& view, const Row* table, int64_t dim,
                       const Quantization& q, float* activations, const ParallelFor& parallel_for,
                       const FeatureRowsPerSc& feature_rows_per_sc, VectorIsa isa,
                       LookupLoop loop) {
  const int64_t samples_per_sc = view.samples_per_sc();
  const int64_t rows_per_shard = view.rows_per_shard();
  const float quantum = q.enabled() ? (q.high - q.low) / static_cast<float>(q.num_buckets - 1) : 0;
  const bool feature_major = !feature_rows_per_sc.empty();
  const FeatureMajorRows order =
      feature_major ? MakeFeatureMajorRows(view, feature_rows_per_sc) : FeatureMajorRows();
  const int64_t F = static_cast<int64_t>(feature_rows_per_sc.size());
  const AccumulateSegmentFn<Row> accumulate = AccumulateSegmentFor<Row>(isa, dim);
  const AccumulateSamplesFn<Row> accumulate_samples = AccumulateSamplesFor<Row>(isa, dim);
  const bool by_sample = loop != LookupLoop::kInBufferOrder && !q.enabled() &&
                         rows_per_shard * dim != 0 && SampleMajorOrder::Fits(view);
  // Each source SparseCore owns a disjoint set of activation rows, so SCs run in parallel.
  const int64_t num_sources = view.num_source_sparse_cores();
  parallel_for(num_sources, 64 * view.num_token_ids / num_sources + 1,
               [&](int64_t sc_begin, int64_t sc_end) {
    for (int64_t s = sc_begin; s < sc_end; ++s) {
      // An empty activation block (no rows or dim 0) may come with a null base pointer: neither
      // offset nor memset it.
      const int64_t block_elements = samples_per_sc * dim;
      if (block_elements == 0) continue;
      const int64_t first_row = s * samples_per_sc;
      const int32_t* out_rows = feature_major ? order.out_row.data() + first_row : nullptr;
      if (by_sample) {
        SampleMajorOrder& samples = SampleMajorOrder::ForThisThread();
        if (samples.Build(view, s)) {
          accumulate_samples(samples.entries(), samples_per_sc, table, dim, activations,
                             first_row, out_rows);
          continue;
        }
        // Out of memory for the grouping: this block is summed in buffer order below.
      }
      if (feature_major) {
        for (int64_t f = 0; f < F; ++f) {
          const auto& run = order.runs[s * F + f];
          std::memset(activations + run.first * dim, 0, sizeof(float) * run.second * dim);
        }
      } else {
        std::memset(activations + first_row * dim, 0, sizeof(float) * block_elements);
      }
      for (int64_t b = 0; b < view.num_minibatches; ++b) {
        for (int64_t p = 0; p < view.local_shards(); ++p) {
          int64_t begin, end;
          view.Segment(s, b, view.first_local_shard + p, &begin, &end);
          if (rows_per_shard * dim == 0) continue;  // no rows to read (and no valid ids)
          const Row* shard = table + p * rows_per_shard * dim;
          if (q.enabled()) {
            AccumulateQuantizedSegment(view, begin, end, shard, dim, q, quantum, activations,
                                       first_row, out_rows);
          } else {
            accumulate(view, begin, end, shard, dim, activations, first_row, out_rows);
          }
        }
      }
    }
  });
}

template <typename Row>
void SumSampleMajorRows(const SampleMajorEntries& entries, int64_t num_samples, const Row* table,
                        int64_t dim, float* activations, int64_t first_row,
                        const int32_t* out_rows, VectorIsa isa) {
  AccumulateSamplesFor<Row>(isa, dim)(entries, num_samples, table, dim, activations, first_row,
                                      out_rows);
}

#define SCE_INSTANTIATE_SUM_SAMPLE_MAJOR_ROWS(Row)                                             \
  template void SumSampleMajorRows<Row>(const SampleMajorEntries&, int64_t, const Row*, int64_t, \
                                        float*, int64_t, const int32_t*, VectorIsa);
SCE_INSTANTIATE_SUM_SAMPLE_MAJOR_ROWS(float)
SCE_INSTANTIATE_SUM_SAMPLE_MAJOR_ROWS(Bfloat16)
SCE_INSTANTIATE_SUM_SAMPLE_MAJOR_ROWS(Float16)
#undef SCE_INSTANTIATE_SUM_SAMPLE_MAJOR_ROWS

template void SparseDenseMatmul<float>(const CsrView&, const float*, int64_t,
                                       const Quantization&, float*, const ParallelFor&,
                                       const FeatureRowsPerSc&, VectorIsa, LookupLoop);
template void SparseDenseMatmul<Bfloat16>(const CsrView&, const Bfloat16*, int64_t,
                                          const Quantization&, float*, const ParallelFor&,
                                          const FeatureRowsPerSc&, VectorIsa, LookupLoop);
template void SparseDenseMatmul<Float16>(const CsrView&, const Float16*, int64_t,
                                         const Quantization&, float*, const ParallelFor&,
                                         const FeatureRowsPerSc&, VectorIsa, LookupLoop);

}  // namespace sce
