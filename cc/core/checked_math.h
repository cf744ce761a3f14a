// The one home of overflow-checked integer arithmetic and of the explicit upper bounds that every
// size computed from op attributes or input shapes must respect. Anything derived from a
// user-supplied number goes through these helpers (and is compared against a bound) before it is
// used to allocate memory, index a buffer or bound a loop, so that a huge attribute becomes an
// InvalidArgument naming the attribute instead of a wrapped-around size.
#ifndef SCE_CORE_CHECKED_MATH_H_
#define SCE_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "cc/core/status.h"

namespace sce {

// ---- Bounds --------------------------------------------------------------------------------
// SparseCores per chip / device (TPUs have 2 or 4); generous, but small enough that per-SparseCore
// vectors, op output lists and loops stay cheap.
constexpr int64_t kMaxSparseCoresPerChip = int64_t{1} << 10;
// Replicas (chips) that shard a table.
constexpr int64_t kMaxReplicas = int64_t{1} << 16;
// Table shards = SparseCores per chip x replicas (the id mask and shard index are int32).
constexpr int64_t kMaxShards = int64_t{1} << 20;
// Elements of any buffer whose size is computed from attributes (CSR buffers at their static
// capacity, id_counts, activations, per-shard counters): 2^28 elements = 1 GiB of int32/float.
constexpr int64_t kMaxAllocationElements = int64_t{1} << 28;
// Entries of the per-(SparseCore, shard, vocabulary division) id_counts of the minibatching ops
// (S * P * 2^L + 1); each costs a loop iteration and int64 counters, so the bound is tighter:
// 2^24 covers 4 SparseCores x 65536 shards x 64 divisions.
constexpr int64_t kMaxIdCounts = int64_t{1} << 24;
// Positions, ids, sample ids and activation rows are int32 in the buffer formats.
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- Checked arithmetic ---------------------------------------------------------------------
// Each returns false (and leaves *out unspecified) when the exact result does not fit in int64.
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool CheckedSub(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_sub_overflow(a, b, out);
}
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// x rounded up to a multiple of m (m > 0, x >= 0).
inline bool CheckedRoundUp(int64_t x, int64_t m, int64_t* out) {
  if (m <= 0 || x < 0) return false;
  const int64_t remainder = x % m;
  if (remainder == 0) {
    *out = x;
    return true;
  }
  return CheckedAdd(x, m - remainder, out);
}
// a * b * c ... for non-negative factors.
inline bool CheckedProduct(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t result = 1;
  for (int64_t f : factors) {
    if (f < 0 || !CheckedMul(result, f, &result)) return false;
  }
  *out = result;
  return true;
}
// a * b with saturation at INT64_MAX (for cost estimates and other non-size heuristics).
inline int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t out;
  return CheckedMul(a, b, &out) ? out : std::numeric_limits<int64_t>::max();
}
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t out;
  if (CheckedAdd(a, b, &out)) return out;
  return a > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

// ---- Validation helpers returning InvalidArgument naming the attribute ------------------------
// `where` is the context prefix, e.g. "table 'video'" or "table 'video', feature 'f'".
inline Status CheckInRange(const std::string& where, const char* name, int64_t value,
                           int64_t min_value, int64_t max_value) {
  if (value < min_value || value > max_value) {
    return InvalidArgument(where, ": ", name, " must be in [", min_value, ", ", max_value,
                           "], got ", value);
  }
  return Status::Ok();
}

// The shard grid of the all-to-all exchange ops: W replicas of S SparseCore shards of R rows
// each (the routing and the owner's CSR both take it).
struct ShardGrid {
  int64_t num_replicas = 1;               // W
  int64_t sparse_cores_per_replica = 1;   // S
  int64_t rows_per_shard = 1;             // R
};

// W in [1, kMaxReplicas], S in [1, kMaxSparseCoresPerChip], R in [1, kMaxInt32]. Products of them
// are checked by the caller, which knows which one it needs.
inline Status CheckShardGrid(const std::string& where, const ShardGrid& grid) {
  SCE_RETURN_IF_ERROR(CheckInRange(where, "num_replicas", grid.num_replicas, 1, kMaxReplicas));
  SCE_RETURN_IF_ERROR(CheckInRange(where, "sparse_cores_per_replica",
                                   grid.sparse_cores_per_replica, 1, kMaxSparseCoresPerChip));
  return CheckInRange(where, "rows_per_shard", grid.rows_per_shard, 1, kMaxInt32);
}

// *out = product of the factors, which must not overflow and must not exceed max_value.
// `what` describes the product, e.g. "num_replica * num_sc_per_chip".
inline Status CheckedSize(const std::string& where, const char* what,
                          std::initializer_list<int64_t> factors, int64_t max_value,
                          int64_t* out) {
  int64_t product;
  if (!CheckedProduct(factors, &product) || product > max_value) {
    std::string values;
    for (int64_t f : factors) values += (values.empty() ? "" : " * ") + std::to_string(f);
    return InvalidArgument(where, ": ", what, " (", values, ") exceeds the limit of ", max_value);
  }
  *out = product;
  return Status::Ok();
}

}  // namespace sce

#endif  // SCE_CORE_CHECKED_MATH_H_
