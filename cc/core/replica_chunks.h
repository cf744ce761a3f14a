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

// The inverse: tables[t] receives rows_per_table[t] entries, chunk after chunk.
void UnpackReplicaChunks(const ReplicaChunks& chunks, const uint32_t* buffer,
                         const std::vector<uint32_t*>& tables);

}  // namespace sce

#endif  // SCE_CORE_REPLICA_CHUNKS_H_
