// The buffers of the all-to-all exchange (docs/multi_worker.md#exchange): W equal chunks, one per
// replica, each holding several tables' entries for that replica, table after table, then padding.
//
// An all-to-all needs one shape on every replica, so a replica's payload for replica d (the ids,
// rows or gradient rows of every stacked table that d owns or asked for) is packed into chunk d of
// a [W * chunk] buffer, and the receiver cuts each table's entries back out of every chunk.
// TensorFlow spells both as splits and concatenations of W x T pieces; these are one copy each.
// Elements are 4-byte words (int32 ids or float32 rows): the copies never look at the values.
#ifndef SCE_CORE_REPLICA_CHUNKS_H_
#define SCE_CORE_REPLICA_CHUNKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

struct ReplicaChunks {
  int64_t num_replicas = 0;
  int64_t chunk = 0;                 // elements per replica chunk
  std::vector<int64_t> widths;       // elements per entry, per table (1 for ids)
  const int32_t* counts = nullptr;   // [num_replicas, tables]: entries of table t in chunk d
};

// Checks counts >= 0, that every chunk's entries fit in `chunk`, and that the buffer
// (num_replicas * chunk) and every table's entries (rows * width) stay within
// kMaxAllocationElements, with overflow-checked arithmetic. On success *rows_per_table holds each
// table's entries summed over the chunks. `where` prefixes messages. Nothing is written.
Status ValidateReplicaChunks(const ReplicaChunks& chunks, const std::string& where,
                             std::vector<int64_t>* rows_per_table);

// tables[t] holds rows_per_table[t] entries sorted by chunk; writes buffer[num_replicas * chunk]
// (padding zeroed). Requires validated chunks.
void PackReplicaChunks(const ReplicaChunks& chunks, const std::vector<const uint32_t*>& tables,
                       uint32_t* buffer);

// The same, with table t's entries gathered: its k-th entry is row indices[t][k] of source[t]
// ([source_rows[t], widths[t]]). The owner side of the exchange packs the rows of its variables
// that others asked for straight from the variables, without an intermediate gathered copy.
// CheckGatherIndices first.
struct GatheredTable {
  const uint32_t* source = nullptr;
  int64_t source_rows = 0;
  const int32_t* indices = nullptr;   // [rows_per_table[t]]
};
Status CheckGatherIndices(const std::vector<GatheredTable>& tables,
                          const std::vector<int64_t>& rows_per_table, const std::string& where);
void PackGatheredReplicaChunks(const ReplicaChunks& chunks,
                               const std::vector<GatheredTable>& tables, uint32_t* buffer);

// The inverse of PackReplicaChunks: tables[t] receives rows_per_table[t] entries, chunk after
// chunk, then zero entries up to padded_rows[t] (padded_rows may be empty: no padding).
void UnpackReplicaChunks(const ReplicaChunks& chunks, const uint32_t* buffer,
                         const std::vector<uint32_t*>& tables,
                         const std::vector<int64_t>& padded_rows = {});

// padded_rows[t]: rows_per_table[t] rounded up to a multiple of multiples[t] (each >= 1), checked
// to stay within kMaxAllocationElements elements. The update of the rows a replica owns reads
// S * ceil(n / S) gradient rows; unpacking them padded saves a copy.
Status PaddedRows(const ReplicaChunks& chunks, const std::vector<int64_t>& rows_per_table,
                  const std::vector<int64_t>& multiples, const std::string& where,
                  std::vector<int64_t>* padded_rows);

}  // namespace sce

#endif  // SCE_CORE_REPLICA_CHUNKS_H_
