// The forward sparse-dense matmul (docs/lookup.md#forward-lookup): each activation row is the gain-weighted sum of the
// (optionally quantized) table rows its sample references.
#ifndef SCE_CORE_LOOKUP_H_
#define SCE_CORE_LOOKUP_H_

#include <cstdint>
#include <vector>

#include "cc/core/activation_rows.h"
#include "cc/core/csr_view.h"
#include "cc/core/parallel.h"
#include "cc/core/row_precision.h"
#include "cc/core/sample_major_order.h"
#include "cc/core/vector_isa.h"

namespace sce {

struct Quantization {
  float low = 0.0f;
  float high = 0.0f;
  int64_t num_buckets = 0;  // 0 means no quantization
  bool enabled() const { return num_buckets > 0; }
};

Status ValidateQuantization(const Quantization& q, const std::string& table_name);

// The loop that sums the entries; both give the same bits. kAuto groups the entries by sample
// (SampleMajorOrder) unless the lookup is quantized or the table has more rows than its 32-bit
// index holds; then it adds them in buffer order. Tests ask for either to compare them.
enum class LookupLoop { kAuto, kInBufferOrder };

// `view` must have passed ValidateCsrView, `feature_rows_per_sc` ValidateFeatureRows. `table` is
// [view.table_rows, dim] of float, Bfloat16 or Float16 (row_precision.h; read as float32);
// `activations` is [view.input_size, dim] and is overwritten. `isa` picks the instruction set of
// the accumulation loop (default: the widest the CPU has; every version gives the same bits); one
// the CPU lacks runs as UsableIsa (vector_isa.h) says.
template <typename Row>
void SparseDenseMatmul(const CsrView& view, const Row* table, int64_t dim,
                       const Quantization& quantization, float* activations,
                       const ParallelFor& parallel_for,
                       const FeatureRowsPerSc& feature_rows_per_sc = {},
                       VectorIsa isa = BestVectorIsa(), LookupLoop loop = LookupLoop::kAuto);

// How many entries ahead the sample-major sum prefetches a table row (every line of it). On the
// 4M-cap benchmark workload (bench/kernel_ab.py, an AMD EPYC machine with AVX-512, 2026-12-01),
// 64 took 6-11% less time than 32 for float32 rows and 9-10% for bfloat16 rows; 96 and 128 were
// within 1% of 64. (On the machine of 2026-11-29, 16 had taken 5-7% more than 32 and 64 was
// within 3% of it.)
constexpr int64_t kSampleMajorPrefetchDistance = 64;

// Prefetches every cache line of the table row of entry k + kSampleMajorPrefetchDistance, if there
// is one below num_entries: what the sample-major sums do before each entry (and
// bench/row_read_floor_main.cc's row reads, which mirror them). Always inlined, so it becomes part
// of each instruction set's build of a loop (a lambda there was not inlined and made the lookup
// 3-4x slower).
template <typename Row>
__attribute__((always_inline)) inline void PrefetchRowAhead(const uint32_t* rows, int64_t k,
                                                            int64_t num_entries,
                                                            const Row* table, int64_t dim) {
  if (k + kSampleMajorPrefetchDistance >= num_entries) return;
  const char* ahead = reinterpret_cast<const char*>(
      table + static_cast<int64_t>(rows[k + kSampleMajorPrefetchDistance]) * dim);
  const int64_t lines = (dim * static_cast<int64_t>(sizeof(Row)) + 63) / 64;
  for (int64_t line = 0; line < lines; ++line) __builtin_prefetch(ahead + 64 * line);
}

// The lookup's sum over entries already grouped by sample (SampleMajorOrder::Build's grouping of
// one source SparseCore, or GroupEntriesByActivationRow's of a whole lookup; rows below the
// table's): sample i's activation row, out_rows[i] or first_row + i when out_rows is null,
// becomes the sum of its entries' gain-weighted rows, with the bits SparseDenseMatmul gives:
// SparseDenseMatmul runs the same loop after grouping each block. bench/row_read_floor_main.cc
// times it apart from the grouping.
template <typename Row>
void SumSampleMajorRows(const SampleMajorEntries& entries, int64_t num_samples, const Row* table,
                        int64_t dim, float* activations, int64_t first_row,
                        const int32_t* out_rows, VectorIsa isa = BestVectorIsa());

}  // namespace sce

#endif  // SCE_CORE_LOOKUP_H_
