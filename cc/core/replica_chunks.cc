#include "cc/core/replica_chunks.h"

#include <cstring>

#include "cc/core/checked_math.h"

namespace sce {
namespace {

// Calls fn(table, offset in the table, offset in the buffer, elements) for every table's piece of
// every chunk, in buffer order, and fn(-1, 0, offset, elements) for each chunk's padding.
template <typename Fn>
void ForEachPiece(const ReplicaChunks& c, Fn fn) {
  const int64_t num_tables = static_cast<int64_t>(c.widths.size());
  std::vector<int64_t> table_offset(num_tables, 0);
  for (int64_t d = 0; d < c.num_replicas; ++d) {
    int64_t at = d * c.chunk;
    for (int64_t t = 0; t < num_tables; ++t) {
      const int64_t elements = c.counts[d * num_tables + t] * c.widths[t];
      fn(t, table_offset[t], at, elements);
      table_offset[t] += elements;
      at += elements;
    }
    fn(-1, 0, at, (d + 1) * c.chunk - at);
  }
}

}  // namespace

Status ValidateReplicaChunks(const ReplicaChunks& c, const std::string& where,
                             std::vector<int64_t>* rows_per_table) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of replicas", c.num_replicas, 1,
                                   kMaxReplicas));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "chunk", c.chunk, 0, kMaxAllocationElements));
  int64_t buffer;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the buffer (replicas * chunk)",
                                  {c.num_replicas, c.chunk}, kMaxAllocationElements, &buffer));
  const int64_t num_tables = static_cast<int64_t>(c.widths.size());
  for (int64_t t = 0; t < num_tables; ++t) {
    if (c.widths[t] < 1 || c.widths[t] > kMaxInt32) {
      return InvalidArgument(where, ": table ", t, "'s width (elements per entry) is ", c.widths[t],
                             ", outside [1, ", kMaxInt32, "]");
    }
  }
  if (num_tables > 0 && c.counts == nullptr) return InvalidArgument(where, ": counts missing");
  rows_per_table->assign(num_tables, 0);
  for (int64_t d = 0; d < c.num_replicas; ++d) {
    int64_t used = 0;
    for (int64_t t = 0; t < num_tables; ++t) {
      const int64_t count = c.counts[d * num_tables + t];
      if (count < 0) {
        return InvalidArgument(where, ": counts[", d, ", ", t, "] = ", count, " is negative");
      }
      // count <= 2^31 and width <= 2^31: the product fits; the sums are bounded below.
      used += count * c.widths[t];
      (*rows_per_table)[t] += count;
      if (used > c.chunk) {
        return InvalidArgument(where, ": the entries for replica ", d, " need at least ", used,
                               " elements, more than chunk = ", c.chunk);
      }
    }
  }
  for (int64_t t = 0; t < num_tables; ++t) {
    int64_t elements;
    SCE_RETURN_IF_ERROR(CheckedSize(where, "a table's entries (rows * width)",
                                    {(*rows_per_table)[t], c.widths[t]}, kMaxAllocationElements,
                                    &elements));
  }
  return Status::Ok();
}

void PackReplicaChunks(const ReplicaChunks& c, const std::vector<const uint32_t*>& tables,
                       uint32_t* buffer) {
  ForEachPiece(c, [&](int64_t t, int64_t from, int64_t at, int64_t elements) {
    if (elements == 0) return;
    if (t < 0) {
      std::memset(buffer + at, 0, sizeof(uint32_t) * elements);
    } else {
      std::memcpy(buffer + at, tables[t] + from, sizeof(uint32_t) * elements);
    }
  });
}

Status CheckGatherIndices(const std::vector<GatheredTable>& tables,
                          const std::vector<int64_t>& rows_per_table, const std::string& where) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const GatheredTable& g = tables[t];
    if (rows_per_table[t] > 0 && g.indices == nullptr) {
      return InvalidArgument(where, ": indices[", t, "] missing");
    }
    for (int64_t k = 0; k < rows_per_table[t]; ++k) {
      if (g.indices[k] < 0 || g.indices[k] >= g.source_rows) {
        return InvalidArgument(where, ": indices[", t, "][", k, "] = ", g.indices[k],
                               " is not a row of params[", t, "] (", g.source_rows, " rows)");
      }
    }
  }
  return Status::Ok();
}

void PackGatheredReplicaChunks(const ReplicaChunks& c, const std::vector<GatheredTable>& tables,
                               uint32_t* buffer) {
  ForEachPiece(c, [&](int64_t t, int64_t from, int64_t at, int64_t elements) {
    if (elements == 0) return;
    if (t < 0) {
      std::memset(buffer + at, 0, sizeof(uint32_t) * elements);
      return;
    }
    const int64_t width = c.widths[t];
    const GatheredTable& g = tables[t];
    uint32_t* out = buffer + at;
    for (int64_t k = from / width, end = (from + elements) / width; k < end; ++k, out += width) {
      std::memcpy(out, g.source + static_cast<int64_t>(g.indices[k]) * width,
                  sizeof(uint32_t) * width);
    }
  });
}

void UnpackReplicaChunks(const ReplicaChunks& c, const uint32_t* buffer,
                         const std::vector<uint32_t*>& tables,
                         const std::vector<int64_t>& padded_rows) {
  std::vector<int64_t> filled(tables.size(), 0);
  ForEachPiece(c, [&](int64_t t, int64_t to, int64_t at, int64_t elements) {
    if (t >= 0 && elements > 0) {
      std::memcpy(tables[t] + to, buffer + at, sizeof(uint32_t) * elements);
    }
    if (t >= 0) filled[t] = to + elements;
  });
  for (size_t t = 0; t < padded_rows.size() && t < tables.size(); ++t) {
    const int64_t end = padded_rows[t] * c.widths[t];
    if (end > filled[t]) {
      std::memset(tables[t] + filled[t], 0, sizeof(uint32_t) * (end - filled[t]));
    }
  }
}

Status PaddedRows(const ReplicaChunks& c, const std::vector<int64_t>& rows_per_table,
                  const std::vector<int64_t>& multiples, const std::string& where,
                  std::vector<int64_t>* padded_rows) {
  padded_rows->clear();
  if (multiples.empty()) return Status::Ok();
  if (multiples.size() != rows_per_table.size()) {
    return InvalidArgument(where, ": row_multiples has ", multiples.size(), " entries for ",
                           rows_per_table.size(), " tables");
  }
  for (size_t t = 0; t < multiples.size(); ++t) {
    if (multiples[t] < 1 || multiples[t] > kMaxInt32) {
      return InvalidArgument(where, ": row_multiples[", t, "] = ", multiples[t],
                             " is outside [1, ", kMaxInt32, "]");
    }
    // rows <= kMaxAllocationElements (validated) and multiple < 2^31: no overflow.
    const int64_t rows = (rows_per_table[t] + multiples[t] - 1) / multiples[t] * multiples[t];
    int64_t elements;
    SCE_RETURN_IF_ERROR(CheckedSize(where, "a table's padded entries (rows * width)",
                                    {rows, c.widths[t]}, kMaxAllocationElements, &elements));
    padded_rows->push_back(rows);
  }
  return Status::Ok();
}

}  // namespace sce
