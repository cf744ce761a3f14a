// libFuzzer target: sce::ValidateGroupedEntries on fuzzed offsets, rows and gains of any sizes
// (what the grouped lookup op takes from outside), then (when it accepts) the grouped lookup
// sce::SparseDenseMatmulGrouped for float32 and bfloat16 rows, which must write every activation
// row and read nothing outside the table (the sanitizers check the reads).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/core/grouped_entries.h"
#include "cc/core/row_precision.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t table_rows = in.ConsumeIntegralInRange<int64_t>(0, 32);
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(0, 40);
  std::vector<int32_t> row_begin(in.ConsumeIntegralInRange<size_t>(0, 24));
  // Mostly non-decreasing offsets (so validation passes often), sometimes arbitrary ones.
  const bool arbitrary = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  int32_t offset = 0;
  for (int32_t& b : row_begin) {
    offset = arbitrary ? in.ConsumeIntegral<int32_t>()
                       : offset + in.ConsumeIntegralInRange<int32_t>(0, 4);
    b = offset;
  }
  if (!row_begin.empty() && in.ConsumeBool()) row_begin[0] = 0;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 100);
  std::vector<int32_t> rows(n);
  for (int32_t& r : rows) {
    r = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 31) : in.ConsumeIntegral<int32_t>();
  }
  std::vector<float> gains = sce_fuzz::Values(in, in.ConsumeIntegralInRange<int>(0, 7) == 0
                                                      ? in.ConsumeIntegralInRange<size_t>(0, 100)
                                                      : n);
  const sce::GroupedEntries e{row_begin.empty() ? nullptr : row_begin.data(),
                              static_cast<int64_t>(row_begin.size()),
                              rows.empty() ? nullptr : rows.data(), static_cast<int64_t>(n),
                              gains.empty() ? nullptr : gains.data(),
                              static_cast<int64_t>(gains.size())};
  if (!sce::ValidateGroupedEntries(e, table_rows, "t").ok()) return 0;
  const int64_t out_rows = e.num_activation_rows();
  std::vector<float> table = sce_fuzz::Values(in, static_cast<size_t>(table_rows * dim));
  std::vector<sce::Bfloat16> narrow(table.size());
  for (sce::Bfloat16& value : narrow) value.bits = in.ConsumeIntegral<uint16_t>();
  std::vector<float> out(static_cast<size_t>(out_rows * dim), -1.0f);
  std::vector<float> narrow_out(out.size(), -1.0f);
  sce::SparseDenseMatmulGrouped(e, table.empty() ? nullptr : table.data(), dim,
                                out.empty() ? nullptr : out.data(), sce::RunSerially);
  sce::SparseDenseMatmulGrouped(e, narrow.empty() ? nullptr : narrow.data(), dim,
                                narrow_out.empty() ? nullptr : narrow_out.data(), sce::RunSerially);
  // A row without entries is +0 in every column.
  for (int64_t a = 0; a < out_rows; ++a) {
    if (row_begin[a] != row_begin[a + 1]) continue;
    for (int64_t j = 0; j < dim; ++j) {
      SCE_FUZZ_CHECK(out[a * dim + j] == 0.0f && !std::signbit(out[a * dim + j]));
      SCE_FUZZ_CHECK(narrow_out[a * dim + j] == 0.0f);
    }
  }
  return 0;
}
