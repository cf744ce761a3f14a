// Packing of sorted, bucketed ids into the CSR-wrapped COO buffers the lookup and update kernels
// consume (docs/preprocessing.md#csr-wrapped-coo-buffers ConvertToSparseCoreCsrWrappedCooTensor and docs/preprocessing.md#csr-buffers-with-minibatches
// GetMinibatchesInCsrWithPhysicalReplica): one row-pointer block per (source SC, minibatch), one
// 8-aligned segment per target shard.
#ifndef SCE_CORE_CSR_H_
#define SCE_CORE_CSR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/coo_entries.h"
#include "cc/core/status.h"

namespace sce {

// Sorted ids of one source SparseCore with their per-shard (and optionally per-division) counts.
struct SortedIdsView : CooEntriesView {
  const int32_t* id_counts = nullptr;
  int64_t num_id_counts = 0;
};

struct CsrParams {
  int64_t num_replica = 1;
  int64_t num_sc_per_chip = kDefaultSparseCoresPerReplica;
  int64_t max_minibatches_per_sc = 1;
  int64_t max_ids_buffer_size = 0;  // MAXC: capacity of the id buffers
  int max_division_level = kDefaultMaxDivisionLevel;
  bool allow_id_dropping = false;
  std::string table_name;
};

// Output buffers, allocated by the caller: at the full sizes GetCsrBufferSizes() returns
// (TensorFlow's static shapes) or, after a dry run with null pointers has computed the unpadded
// sizes, at exactly those. Entries past the unpadded sizes are filled with PAD (TensorFlow leaves
// them uninitialized).
struct CsrBuffers {
  int32_t* row_pointers = nullptr;  // nullptr: dry run, only sizes and num_dropped_ids computed
  int32_t* sample_ids = nullptr;
  int32_t* token_ids = nullptr;
  float* gains = nullptr;
  int64_t row_pointer_buffer_size = 0;
  int64_t id_buffer_size = 0;
  int64_t row_pointers_unpadded_size = 0;
  int64_t ids_unpadded_size = 0;
  int64_t num_minibatches = 0;
  int64_t num_dropped_ids = 0;
};

struct CsrBufferSizes {
  int64_t row_pointers = 0;  // max_minibatches_per_sc * S * RoundUp(P, 8)
  int64_t ids = 0;           // max_ids_buffer_size
};
// Validates the parameters (checked arithmetic, explicit bounds) and computes the static sizes.
Status GetCsrBufferSizes(const CsrParams& params, CsrBufferSizes* sizes);

// The one home of the static buffer-size formulas; GetCsrBufferSizes, the op shape functions
// (cc/ops) and the kernels (cc/kernels) call these. Every product is overflow-checked and must not
// exceed `max_value`; errors start with `where` (e.g. "table 'video'").
//
// Row pointers: one 8-aligned block of per-shard pointers per source SparseCore and minibatch,
// max_minibatches_per_sc * S * RoundUp(num_replica * S, 8).
Status CsrRowPointerBufferSize(const std::string& where, int64_t num_replica,
                               int64_t num_sc_per_chip, int64_t max_minibatches_per_sc,
                               int64_t max_value, int64_t* size);
// Id buffer capacity (MAXC) of ConvertToSparseCoreCsrWrappedCooTensor:
// max_ids_per_chip_per_sample * sample_count_per_sc * num_sc_per_chip.
Status WrappedCooIdBufferSize(const std::string& where, int64_t max_ids_per_chip_per_sample,
                              int64_t sample_count_per_sc, int64_t num_sc_per_chip,
                              int64_t max_value, int64_t* size);
// Id buffer capacity of GetMinibatchesInCsrWithPhysicalReplica:
// max_ids_per_chip_per_sample * sample_count (the per-chip batch).
Status MinibatchCsrIdBufferSize(const std::string& where, int64_t max_ids_per_chip_per_sample,
                                int64_t sample_count, int64_t max_value, int64_t* size);

// See docs/preprocessing.md#csr-wrapped-coo-buffers: one SortedIdsView per source SparseCore; `splits` is the OR of all split masks.
Status PackCsrFromSortedLists(const std::vector<SortedIdsView>& per_sc, int64_t splits,
                              const CsrParams& params, CsrBuffers* out);

// See docs/preprocessing.md#csr-buffers-with-minibatches: a single sorted array for the whole chip with S * P * 2^L + 1 id_counts.
Status PackCsrFromMinibatchSplits(const SortedIdsView& ids, int64_t splits,
                                  const CsrParams& params, CsrBuffers* out);

}  // namespace sce

#endif  // SCE_CORE_CSR_H_
