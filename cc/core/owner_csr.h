// The owner side of the all-to-all exchange's backward pass (docs/multi_worker.md#exchange): the
// rows of its own variable that a replica received gradients for -> a CSR the fused update
// kernels read (docs/preprocessing.md#csr).
//
// The CSR has one source replica and one minibatch. Entry i (the i-th received row) is sample
// i mod M of source SparseCore i div M (M = ceil(n / S)), so the kernel reads its gradient from
// activation row i: the received gradients are used in the order they arrived, with no reorder
// (padded to S * M rows). Within each (source SparseCore, shard) segment the entries keep their
// received order, so a row's contributions are summed in the order of the replicas that sent
// them. Each segment starts 8-aligned and padding holds kPad, as the format requires. The shard
// segment of a source SparseCore is found at index source_sc * block + replica_id * S + shard,
// where block = S * W rounded up to 8: the CSR view of this replica's S local shards among all
// W * S.
#ifndef SCE_CORE_OWNER_CSR_H_
#define SCE_CORE_OWNER_CSR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/status.h"

namespace sce {

struct OwnerCsrParams : ShardGrid {
  int64_t replica_id = 0;                 // this replica, in [0, W)
};

struct OwnerCsrSizes {
  int64_t row_pointers = 0;      // S * block
  int64_t entries = 0;           // padded entries (the id buffers' size)
  int64_t activation_rows = 0;   // S * M
};

// Checks the parameters, every row in [0, S * R), and the buffer sizes (overflow-checked, within
// int32 and kMaxAllocationElements); fills *sizes. `where` prefixes messages.
Status ValidateOwnerCsr(const OwnerCsrParams& params, const int32_t* rows, int64_t n,
                        const std::string& where, OwnerCsrSizes* sizes);

// Writes the CSR into buffers of the validated sizes: row_pointers[sizes.row_pointers],
// sample_ids / token_ids / gains[sizes.entries].
void BuildOwnerCsr(const OwnerCsrParams& params, const int32_t* rows, int64_t n,
                   const OwnerCsrSizes& sizes, int32_t* row_pointers, int32_t* sample_ids,
                   int32_t* token_ids, float* gains);

}  // namespace sce

#endif  // SCE_CORE_OWNER_CSR_H_
