#include "cc/core/grouped_entries.h"

#include <algorithm>
#include <cstring>

#include "cc/core/checked_math.h"
#include "cc/core/lookup.h"
#include "cc/core/row_precision.h"
#include "cc/core/sample_major_order.h"

namespace sce {

namespace {

// Calls visit(activation row, table row, gain) for every valid entry of source SparseCores
// [sc_begin, sc_end), each SparseCore's entries in ForEachValidEntry's order. Each SparseCore
// owns a disjoint set of activation rows, so ranges of SparseCores may run in parallel.
template <typename Visit>
void ForEachEntryOfActivationRows(const CsrView& view, const FeatureMajorRows& order,
                                  int64_t sc_begin, int64_t sc_end, Visit&& visit) {
  const int64_t samples_per_sc = view.samples_per_sc();
  const bool feature_major = !order.out_row.empty();
  for (int64_t sc = sc_begin; sc < sc_end; ++sc) {
    const int64_t first_row = sc * samples_per_sc;
    const int32_t* out_row = feature_major ? order.out_row.data() + first_row : nullptr;
    ForEachValidEntry(view, sc, [&](int32_t sample, int64_t row, float gain) {
      visit(out_row ? static_cast<int64_t>(out_row[sample]) : first_row + sample, row, gain);
    });
  }
}

FeatureMajorRows OrderOf(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc) {
  return feature_rows_per_sc.empty() ? FeatureMajorRows()
                                     : MakeFeatureMajorRows(view, feature_rows_per_sc);
}

// A rough cost per source SparseCore for the thread pool's block size.
int64_t CostPerSparseCore(const CsrView& view) {
  return 8 * view.num_token_ids / view.num_source_sparse_cores() + 1;
}

}  // namespace

Status CheckGroupable(const CsrView& view) {
  if (view.table_rows > kMaxInt32) {
    return InvalidArgument("table '", view.table_name, "': a grouped lookup indexes rows with int32; ",
                           "the table has ", view.table_rows, " rows");
  }
  return Status::Ok();
}

Status CountEntriesPerActivationRow(const CsrView& view,
                                    const FeatureRowsPerSc& feature_rows_per_sc,
                                    int32_t* row_begin, int64_t* num_entries,
                                    const ParallelFor& parallel_for) {
  const int64_t rows = view.input_size;
  std::memset(row_begin, 0, sizeof(int32_t) * (rows + 1));
  const FeatureMajorRows order = OrderOf(view, feature_rows_per_sc);
  // One activation row belongs to one source SparseCore of one chunk of buffers whose positions
  // int32 row pointers index, so no count overflows int32; only their total can.
  parallel_for(view.num_source_sparse_cores(), CostPerSparseCore(view),
               [&](int64_t begin, int64_t end) {
    ForEachEntryOfActivationRows(view, order, begin, end,
                                 [&](int64_t a, int64_t, float) { ++row_begin[a + 1]; });
  });
  int64_t total = 0;
  for (int64_t a = 0; a < rows; ++a) {
    total += row_begin[a + 1];
    if (total > kMaxInt32) {
      return InvalidArgument("table '", view.table_name, "': more than ", kMaxInt32,
                             " valid entries to group");
    }
    row_begin[a + 1] = static_cast<int32_t>(total);
  }
  *num_entries = total;
  return Status::Ok();
}

void PlaceEntriesByActivationRow(const CsrView& view, const FeatureRowsPerSc& feature_rows_per_sc,
                                 int32_t* cursor, int32_t* rows, float* gains,
                                 const ParallelFor& parallel_for) {
  const FeatureMajorRows order = OrderOf(view, feature_rows_per_sc);
  parallel_for(view.num_source_sparse_cores(), CostPerSparseCore(view),
               [&](int64_t begin, int64_t end) {
    ForEachEntryOfActivationRows(view, order, begin, end, [&](int64_t a, int64_t row, float gain) {
      const int32_t slot = cursor[a]++;
      rows[slot] = static_cast<int32_t>(row);
      gains[slot] = gain;
    });
  });
}

namespace {

// The lookup checks its grouping on every call, before its sums, so the two scans below are
// branch-free reductions the compiler vectorizes: as loops that stop at the first culprit they
// took 5.7-6.5% of a dequeue's CPU samples (perf; BENCHMARKS.md, "Design measurements"). Only
// when a check fails does a second loop find the culprit to name.

// Whether row_begin[a] <= row_begin[a + 1] for every a.
bool NeverDecreases(const int32_t* row_begin, int64_t n) {
  int32_t decreases = 0;
  for (int64_t a = 0; a + 1 < n; ++a) decreases |= row_begin[a + 1] < row_begin[a];
  return decreases == 0;
}

// Whether every rows[k] lies in [0, table_rows). Compared as unsigned, a negative row reads as
// one beyond any limit an int32 row can meet (a table of more rows bounds them no further).
bool AllRowsInside(const int32_t* rows, int64_t n, int64_t table_rows) {
  const uint32_t limit =
      static_cast<uint32_t>(std::min<int64_t>(table_rows, int64_t{kMaxInt32} + 1));
  const uint32_t* as_unsigned = reinterpret_cast<const uint32_t*>(rows);
  int32_t outside = 0;
  for (int64_t k = 0; k < n; ++k) outside |= as_unsigned[k] >= limit;
  return outside == 0;
}

}  // namespace

Status ValidateGroupedEntries(const GroupedEntries& e, int64_t table_rows,
                              const std::string& table_name) {
  if (e.num_row_begin < 1) {
    return InvalidArgument("table '", table_name,
                           "': activation_row_begin needs at least one entry (0 for no rows)");
  }
  if (e.row_begin[0] != 0) {
    return InvalidArgument("table '", table_name, "': activation_row_begin[0] must be 0, got ",
                           e.row_begin[0]);
  }
  if (!NeverDecreases(e.row_begin, e.num_row_begin)) {
    for (int64_t a = 0; a + 1 < e.num_row_begin; ++a) {
      if (e.row_begin[a + 1] < e.row_begin[a]) {
        return InvalidArgument("table '", table_name, "': activation_row_begin decreases at ",
                               a + 1, " (", e.row_begin[a], " then ", e.row_begin[a + 1], ")");
      }
    }
  }
  const int64_t total = e.row_begin[e.num_row_begin - 1];
  if (e.num_rows != total || e.num_gains != total) {
    return InvalidArgument("table '", table_name, "': activation_row_begin ends at ", total,
                           " entries, but entry_rows has ", e.num_rows, " and entry_gains ",
                           e.num_gains);
  }
  if (!AllRowsInside(e.rows, total, table_rows)) {
    for (int64_t k = 0; k < total; ++k) {
      if (e.rows[k] < 0 || e.rows[k] >= table_rows) {
        return InvalidArgument("table '", table_name, "': entry_rows[", k, "] = ", e.rows[k],
                               " is outside the table's ", table_rows, " rows");
      }
    }
  }
  return Status::Ok();
}

template <typename Row>
void SparseDenseMatmulGrouped(const GroupedEntries& e, const Row* table, int64_t dim,
                              float* activations, const ParallelFor& parallel_for,
                              VectorIsa isa) {
  const int64_t rows = e.num_activation_rows();
  if (rows * dim == 0) return;  // nothing to write (the output may have a null base)
  const int64_t total = e.row_begin[rows];
  // Validated rows are >= 0, so they read the same as uint32 (the sum loop's row index).
  const uint32_t* table_rows = reinterpret_cast<const uint32_t*>(e.rows);
  parallel_for(rows, 16 * dim * (total / rows + 1), [&](int64_t begin, int64_t end) {
    const SampleMajorEntries part{e.row_begin + begin, table_rows, e.gains};
    SumSampleMajorRows(part, end - begin, table, dim, activations, begin, nullptr, isa);
  });
}

template void SparseDenseMatmulGrouped<float>(const GroupedEntries&, const float*, int64_t, float*,
                                              const ParallelFor&, VectorIsa);
template void SparseDenseMatmulGrouped<Bfloat16>(const GroupedEntries&, const Bfloat16*, int64_t,
                                                 float*, const ParallelFor&, VectorIsa);
template void SparseDenseMatmulGrouped<Float16>(const GroupedEntries&, const Float16*, int64_t,
                                                float*, const ParallelFor&, VectorIsa);

}  // namespace sce
