// A validated view of the CSR-wrapped COO buffers (docs/lookup.md#reading-the-csr-buffers) as consumed by the lookup and the
// fused update: entry (sample, token, gain) of segment (source SC s, minibatch b, target shard p)
// reads table row p * R + token and activation row s * (input_size / S) + sample.
//
// Two generalisations serve data-parallel training without a TPU:
// * the buffers of G replicas may be concatenated (all-gathered): row_pointers and the id buffers
//   then hold G equal chunks, each with positions relative to its own chunk, and the activation
//   rows of replica g follow those of replica g - 1 (source SparseCore g * S + s);
// * the table may hold only the shards [first_local_shard, first_local_shard + num_local_shards);
//   entries for other shards are skipped (the replica that owns them handles them).
#ifndef SCE_CORE_CSR_VIEW_H_
#define SCE_CORE_CSR_VIEW_H_

#include <cstdint>
#include <string>

#include "cc/core/constants.h"
#include "cc/core/status.h"

namespace sce {

struct CsrView {
  const int32_t* row_pointers = nullptr;
  int64_t num_row_pointers = 0;
  const int32_t* sample_ids = nullptr;
  const int32_t* token_ids = nullptr;
  const float* gains = nullptr;
  int64_t num_sample_ids = 0;
  int64_t num_token_ids = 0;
  int64_t num_gains = 0;
  int64_t num_minibatches = 1;
  int64_t num_sc_per_device = kDefaultSparseCoresPerReplica;  // S
  int64_t num_replica = 1;                                     // P = S * num_replica shards
  int64_t input_size = 0;      // activation rows (G * B_stk)
  int64_t table_rows = 0;      // rows of the table given (num_local_shards * R)
  int64_t num_source_replicas = 1;  // G: replicas whose buffers are concatenated
  int64_t first_local_shard = 0;
  int64_t num_local_shards = -1;    // -1: all P shards
  std::string table_name;

  // The helpers below are only meaningful once ValidateCsrView has accepted the view: it checks
  // with overflow-checked arithmetic that every product and sum they form fits well in int64.
  int64_t num_shards() const { return num_sc_per_device * num_replica; }
  int64_t local_shards() const { return num_local_shards < 0 ? num_shards() : num_local_shards; }
  int64_t rows_per_shard() const { return table_rows / local_shards(); }
  int64_t num_source_sparse_cores() const { return num_source_replicas * num_sc_per_device; }
  int64_t samples_per_sc() const { return input_size / num_source_sparse_cores(); }
  int64_t block_size() const { return RoundUp(num_shards(), kXlaPadSize); }
  int64_t row_pointer_chunk() const { return num_row_pointers / num_source_replicas; }
  int64_t id_chunk() const { return num_token_ids / num_source_replicas; }

  // [begin, end) of segment (source SparseCore sc = g * S + s, minibatch b, shard p) in the
  // concatenated id buffers. Indexes the buffers (no pointer arithmetic on a possibly null base).
  void Segment(int64_t sc, int64_t b, int64_t p, int64_t* begin, int64_t* end) const {
    const int64_t g = sc / num_sc_per_device, s = sc % num_sc_per_device;
    const int64_t first = g * row_pointer_chunk();
    const int64_t k = (s * num_minibatches + b) * block_size() + p;
    const int64_t base = g * id_chunk();
    *begin = base + (k == 0 ? 0 : RoundUp(row_pointers[first + k - 1], kXlaPadSize));
    *end = base + row_pointers[first + k];
  }
};

// Checks every size, every row pointer and every non-padding (sample, token) before any kernel
// reads or writes memory through the view.
Status ValidateCsrView(const CsrView& view);

}  // namespace sce

#endif  // SCE_CORE_CSR_VIEW_H_
