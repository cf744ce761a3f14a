// A validated view of the CSR-wrapped COO buffers (spec §12) as consumed by the lookup and the
// fused update: entry (sample, token, gain) of segment (source SC s, minibatch b, target shard p)
// reads table row p * R + token and activation row s * (input_size / S) + sample.
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
  int64_t input_size = 0;                                      // activation rows (B_stk)
  int64_t table_rows = 0;                                      // rows of the table given (P * R)
  std::string table_name;

  int64_t num_shards() const { return num_sc_per_device * num_replica; }
  int64_t rows_per_shard() const { return table_rows / num_shards(); }
  int64_t samples_per_sc() const { return input_size / num_sc_per_device; }
  int64_t block_size() const { return RoundUp(num_shards(), kXlaPadSize); }

  // [begin, end) of segment (s, b, p) in the id buffers.
  void Segment(int64_t s, int64_t b, int64_t p, int64_t* begin, int64_t* end) const {
    const int64_t k = (s * num_minibatches + b) * block_size() + p;
    *begin = k == 0 ? 0 : RoundUp(row_pointers[k - 1], kXlaPadSize);
    *end = row_pointers[k];
  }
};

// Checks every size, every row pointer and every non-padding (sample, token) before any kernel
// reads or writes memory through the view.
Status ValidateCsrView(const CsrView& view);

}  // namespace sce

#endif  // SCE_CORE_CSR_VIEW_H_
