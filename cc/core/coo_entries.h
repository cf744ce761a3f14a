// The (rows, cols, gains) triple that every preprocessing stage hands to the next
// (docs/preprocessing.md#host-preprocessing): declared once here, as an owning form (CooEntries)
// and a borrowed view of three buffers (CooEntriesView). The stage-specific structs extend them
// with what they add (id_counts, splits, sample counts).
#ifndef SCE_CORE_COO_ENTRIES_H_
#define SCE_CORE_COO_ENTRIES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sce {

// rows[i]: sample (row of the activations), cols[i]: id (row of the table), gains[i]: weight.
struct CooEntries {
  std::vector<int32_t> rows;
  std::vector<int32_t> cols;
  std::vector<float> gains;
  size_t size() const { return rows.size(); }
  void Reserve(size_t n) {
    rows.reserve(n);
    cols.reserve(n);
    gains.reserve(n);
  }
  void Push(int32_t row, int32_t col, float gain) {
    rows.push_back(row);
    cols.push_back(col);
    gains.push_back(gain);
  }
};

// The same triple in buffers owned elsewhere (e.g. op input tensors). The three lengths are kept
// separately so that the consumer can reject inputs whose lengths differ.
struct CooEntriesView {
  const int32_t* rows = nullptr;
  const int32_t* cols = nullptr;
  const float* gains = nullptr;
  int64_t num_rows = 0;
  int64_t num_cols = 0;
  int64_t num_gains = 0;
};

}  // namespace sce

#endif  // SCE_CORE_COO_ENTRIES_H_
