#include "cc/core/owner_csr.h"

#include <algorithm>
#include <vector>

#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/range_scan.h"

namespace sce {
namespace {

int64_t Block(const OwnerCsrParams& p) {
  return (p.sparse_cores_per_replica * p.num_replicas + kXlaPadSize - 1) / kXlaPadSize *
         kXlaPadSize;
}

int64_t PerSparseCore(const OwnerCsrParams& p, int64_t n) {
  return (n + p.sparse_cores_per_replica - 1) / p.sparse_cores_per_replica;
}

// The local shard of a validated row (in [0, S * R), so both fit in 32 bits): a 32-bit division,
// a fraction of the cost of a 64-bit one on x86.
inline int64_t ShardOf(int32_t row, uint32_t rows_per_shard) {
  return static_cast<uint32_t>(row) / rows_per_shard;
}

// Entries per (source SparseCore, local shard), in key order (source_sc * S + shard): entry i
// belongs to source SparseCore i div M, so source s holds the entries [s * M, (s + 1) * M).
void CountSegments(const OwnerCsrParams& p, const int32_t* rows, int64_t n,
                   std::vector<int64_t>* counts) {
  const int64_t S = p.sparse_cores_per_replica;
  const int64_t M = std::max<int64_t>(PerSparseCore(p, n), 1);
  const uint32_t R = static_cast<uint32_t>(p.rows_per_shard);
  counts->assign(S * S, 0);
  for (int64_t source = 0; source < S; ++source) {
    int64_t* segment = counts->data() + source * S;
    const int64_t end = std::min(n, (source + 1) * M);
    for (int64_t i = source * M; i < end; ++i) ++segment[ShardOf(rows[i], R)];
  }
}

}  // namespace

Status ValidateOwnerCsr(const OwnerCsrParams& p, const int32_t* rows, int64_t n,
                        const std::string& where, OwnerCsrSizes* sizes) {
  SCE_RETURN_IF_ERROR(
      CheckShardGrid(where, p));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "replica_id", p.replica_id, 0, p.num_replicas - 1));
  const int64_t S = p.sparse_cores_per_replica;
  int64_t local_rows;
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the replica's rows (sparse cores * rows per shard)",
                                  {S, p.rows_per_shard}, kMaxInt32, &local_rows));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the number of rows received", n, 0, kMaxInt32));
  SCE_RETURN_IF_ERROR(CheckedSize(where, "the row pointers (sparse cores * block)",
                                  {S, Block(p)}, kMaxAllocationElements, &sizes->row_pointers));
  if (n > 0 && rows == nullptr) return InvalidArgument(where, ": rows missing");
  const int64_t bad = FirstOutOfRange(rows, n, local_rows);
  if (bad >= 0) {
    return InvalidArgument(where, ": rows[", bad, "] = ", rows[bad],
                           " is not a row of this replica's variable (", local_rows, " rows)");
  }
  // Each segment is padded to a multiple of 8: at most n + 7 * S * S entries.
  std::vector<int64_t> counts;
  CountSegments(p, rows, n, &counts);
  int64_t entries = 0;
  for (int64_t c : counts) entries += (c + kXlaPadSize - 1) / kXlaPadSize * kXlaPadSize;
  SCE_RETURN_IF_ERROR(CheckInRange(where, "the CSR's padded entries", entries, 0,
                                   std::min<int64_t>(kMaxInt32, kMaxAllocationElements)));
  sizes->entries = entries;
  sizes->activation_rows = S * PerSparseCore(p, n);
  return Status::Ok();
}

void BuildOwnerCsr(const OwnerCsrParams& p, const int32_t* rows, int64_t n,
                   const OwnerCsrSizes& sizes, int32_t* row_pointers, int32_t* sample_ids,
                   int32_t* token_ids, float* gains) {
  const int64_t S = p.sparse_cores_per_replica;
  const int64_t R = p.rows_per_shard;
  const int64_t block = Block(p);
  const int64_t M = std::max<int64_t>(PerSparseCore(p, n), 1);
  // Segment sizes in key order; row pointers over all S * block keys (empty keys repeat).
  std::vector<int64_t> counts;
  CountSegments(p, rows, n, &counts);
  std::fill(sample_ids, sample_ids + sizes.entries, kPad);
  std::fill(token_ids, token_ids + sizes.entries, kPad);
  std::fill(gains, gains + sizes.entries, static_cast<float>(kPad));
  std::vector<int64_t> segment_begin(S * S, 0);
  int64_t end = 0;
  for (int64_t source = 0; source < S; ++source) {
    for (int64_t key = 0; key < block; ++key) {
      const int64_t shard = key - p.replica_id * S;
      if (shard >= 0 && shard < S) {
        const int64_t c = counts[source * S + shard];
        segment_begin[source * S + shard] = end;
        end += (c + kXlaPadSize - 1) / kXlaPadSize * kXlaPadSize;
        row_pointers[source * block + key] = static_cast<int32_t>(end - (
            (c + kXlaPadSize - 1) / kXlaPadSize * kXlaPadSize) + c);
      } else {
        row_pointers[source * block + key] = static_cast<int32_t>(end);
      }
    }
  }
  // Entry i goes to its segment, in order: source by source, the next free place of each of its
  // segments (segment_begin becomes the fill position).
  for (int64_t source = 0; source < S; ++source) {
    int64_t* next = segment_begin.data() + source * S;
    const int64_t first = source * M;
    const int64_t last = std::min(n, first + M);
    for (int64_t i = first; i < last; ++i) {
      const int32_t row = rows[i];
      const int64_t shard = ShardOf(row, static_cast<uint32_t>(R));
      const int64_t slot = next[shard]++;
      sample_ids[slot] = static_cast<int32_t>(i - first);
      token_ids[slot] = static_cast<int32_t>(row - shard * R);
      gains[slot] = 1.0f;
    }
  }
}

}  // namespace sce
