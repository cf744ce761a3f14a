#include "cc/core/csr_view.h"

#include <algorithm>
#include <cstdint>

#include "cc/core/checked_math.h"

namespace sce {
namespace {

// Attribute ranges first: every product formed later is then small enough to be formed safely,
// and is still formed with checked arithmetic. Sets *num_shards (S * num_replica).
Status ValidateTopology(const CsrView& v, const std::string& t, int64_t* num_shards) {
  if (!IsPowerOfTwo(v.num_sc_per_device) || v.num_sc_per_device > kMaxSparseCoresPerChip) {
    return InvalidArgument(t, ": num_sparsecores_per_device must be a power of two in [1, ",
                           kMaxSparseCoresPerChip, "], got ", v.num_sc_per_device);
  }
  if (v.num_replica < 1) return InvalidArgument(t, ": num_replica must be >= 1");
  SCE_RETURN_IF_ERROR(CheckInRange(t, "num_replica", v.num_replica, 1, kMaxReplicas));
  return CheckedSize(t, "the number of shards, num_sparsecores_per_device * num_replica",
                     {v.num_sc_per_device, v.num_replica}, kMaxShards, num_shards);
}

// The buffer lengths, the source replicas, the activation rows and the local shards.
Status ValidateSizes(const CsrView& v, const std::string& t, int64_t num_shards) {
  if (v.num_sample_ids != v.num_token_ids || v.num_sample_ids != v.num_gains) {
    return InvalidArgument(t, ": sorted_sample_ids (", v.num_sample_ids, "), sorted_token_ids (",
                           v.num_token_ids, ") and sorted_gains (", v.num_gains,
                           ") must have the same length");
  }
  if (v.num_source_replicas < 1) {
    return InvalidArgument(t, ": num_source_replicas must be >= 1, got ", v.num_source_replicas);
  }
  SCE_RETURN_IF_ERROR(
      CheckInRange(t, "num_source_replicas", v.num_source_replicas, 1, kMaxReplicas));
  int64_t num_sources;
  SCE_RETURN_IF_ERROR(CheckedSize(t, "num_source_replicas * num_sparsecores_per_device",
                                  {v.num_source_replicas, v.num_sc_per_device}, kMaxInt32,
                                  &num_sources));
  // Activation rows are int32 indices (sample ids and the rows of the fused update).
  if (v.input_size < 0 || v.input_size > kMaxInt32 || v.input_size % num_sources != 0) {
    return InvalidArgument(t, ": the activation row count (input_size, ", v.input_size,
                           ") must be a non-negative multiple of the SparseCores per device (",
                           v.num_sc_per_device, ") times the source replicas (",
                           v.num_source_replicas, ") and at most ", kMaxInt32);
  }
  int64_t local_end = 0;
  if (v.num_local_shards < -1 || v.num_local_shards == 0 || v.first_local_shard < 0 ||
      !CheckedAdd(v.first_local_shard, v.local_shards(), &local_end) || local_end > num_shards) {
    return InvalidArgument(t, ": local shards (first_local_shard ", v.first_local_shard,
                           ", num_local_shards ", v.num_local_shards, ") are not within the ",
                           num_shards, " shards");
  }
  if (v.table_rows < 0 || v.table_rows % v.local_shards() != 0) {
    return InvalidArgument(t, ": the table has ", v.table_rows,
                           " rows, which is not a multiple of the number of shards it holds (",
                           v.local_shards(), ")");
  }
  if (v.num_row_pointers % v.num_source_replicas != 0 ||
      v.num_token_ids % v.num_source_replicas != 0) {
    return InvalidArgument(t, ": row_pointers (", v.num_row_pointers, ") and id buffers (",
                           v.num_token_ids, ") must split into ", v.num_source_replicas,
                           " equal chunks, one per source replica");
  }
  return Status::Ok();
}

// Every row pointer a segment uses: non-decreasing, 8-aligned starts, within the id buffers.
Status ValidateRowPointers(const CsrView& v, const std::string& t, int64_t num_shards) {
  if (v.num_minibatches < 1) {
    return InvalidArgument(t, ": num_minibatches_per_physical_sparse_core must be >= 1, got ",
                           v.num_minibatches);
  }
  int64_t block = 0, used = 0;
  if (!CheckedRoundUp(num_shards, kXlaPadSize, &block) ||
      !CheckedProduct({v.num_sc_per_device, v.num_minibatches, block}, &used) ||
      used > v.row_pointer_chunk()) {
    return InvalidArgument(t, ": row_pointers has ", v.row_pointer_chunk(),
                           " entries per replica but ", v.num_minibatches, " minibatch(es) x ",
                           v.num_sc_per_device, " SparseCores x ", block,
                           " (shards rounded up to 8) entries are needed for ", num_shards,
                           " shards");
  }
  for (int64_t g = 0; g < v.num_source_replicas; ++g) {
    const int64_t first = g * v.row_pointer_chunk();
    int64_t previous_end = 0;
    for (int64_t k = 0; k < used; ++k) {
      const int64_t begin = k == 0 ? 0 : RoundUp(v.row_pointers[first + k - 1], kXlaPadSize);
      const int64_t end = v.row_pointers[first + k];
      if (end < begin || end < previous_end) {
        return InvalidArgument(t, ": row_pointers must be non-decreasing with 8-aligned segment "
                               "starts; row_pointers[", g * v.row_pointer_chunk() + k, "] = ", end,
                               " is below ", begin);
      }
      if (end > v.id_chunk()) {
        return InvalidArgument(t, ": row_pointers[", g * v.row_pointer_chunk() + k, "] = ", end,
                               " is past the ", v.id_chunk(), " ids given per replica");
      }
      previous_end = end;
    }
  }
  return Status::Ok();
}

// The limit an int32 id is compared with as uint32: a negative id becomes >= 2^31, so it fails
// the comparison like an id past the end; a limit beyond 2^31 admits every non-negative id.
uint32_t IdLimit(int64_t size) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(size, 0), int64_t{1} << 31));
}

// Whether every non-padding (token, sample) pair of ids [begin, end) is in range. This pass runs
// over every id of every lookup and update before any work, on one thread: it is written without
// branches so that it vectorizes (an OR of per-id flags); the error path rescans for the message.
__attribute__((target_clones("avx512f", "avx2", "default"))) bool IdsInRange(
    const int32_t* tokens, const int32_t* samples, int64_t begin, int64_t end,
    uint32_t token_limit, uint32_t sample_limit) {
  uint32_t bad = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t token = static_cast<uint32_t>(tokens[i]);
    const uint32_t sample = static_cast<uint32_t>(samples[i]);
    const uint32_t padding = static_cast<uint32_t>(tokens[i] == kPad) |
                             static_cast<uint32_t>(samples[i] == kPad);
    const uint32_t out_of_range = static_cast<uint32_t>(token >= token_limit) |
                                  static_cast<uint32_t>(sample >= sample_limit);
    bad |= out_of_range & (padding ^ 1u);
  }
  return bad == 0;
}

// Every non-padding (sample, token) of the local shards' segments is in range.
Status ValidateIds(const CsrView& v, const std::string& t) {
  const int64_t rows_per_shard = v.rows_per_shard();
  const int64_t samples_per_sc = v.samples_per_sc();
  const uint32_t token_limit = IdLimit(rows_per_shard), sample_limit = IdLimit(samples_per_sc);
  for (int64_t s = 0; s < v.num_source_sparse_cores(); ++s) {
    for (int64_t b = 0; b < v.num_minibatches; ++b) {
      for (int64_t p = v.first_local_shard; p < v.first_local_shard + v.local_shards(); ++p) {
        int64_t begin, end;
        v.Segment(s, b, p, &begin, &end);
        if (IdsInRange(v.token_ids, v.sample_ids, begin, end, token_limit, sample_limit)) {
          continue;
        }
        for (int64_t i = begin; i < end; ++i) {
          const int32_t token = v.token_ids[i], sample = v.sample_ids[i];
          if (token == kPad || sample == kPad) continue;
          if (token < 0 || token >= rows_per_shard) {
            return InvalidArgument(t, ": token id ", token, " at position ", i,
                                   " is out of range for a shard of ", rows_per_shard, " rows");
          }
          if (sample < 0 || sample >= samples_per_sc) {
            return InvalidArgument(t, ": sample id ", sample, " at position ", i,
                                   " is out of range for ", samples_per_sc,
                                   " samples per SparseCore");
          }
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCsrView(const CsrView& v) {
  const std::string t = "table '" + v.table_name + "'";
  int64_t num_shards;
  SCE_RETURN_IF_ERROR(ValidateTopology(v, t, &num_shards));
  SCE_RETURN_IF_ERROR(ValidateSizes(v, t, num_shards));
  SCE_RETURN_IF_ERROR(ValidateRowPointers(v, t, num_shards));
  return ValidateIds(v, t);
}

}  // namespace sce
