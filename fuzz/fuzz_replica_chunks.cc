// libFuzzer target: sce::ValidateReplicaChunks + Pack/UnpackReplicaChunks (cc/core/replica_chunks.h)
// with arbitrary counts, widths and chunk sizes. Whatever is accepted must pack and unpack within
// the buffers the TensorFlow kernels allocate from the validated sizes (ASan), and round-trip;
// the gathered pack must equal the pack of the gathered rows, and the padded unpack must zero
// exactly the padding.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cc/core/replica_chunks.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  sce::ReplicaChunks chunks;
  chunks.num_replicas = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 6)
                                         : sce_fuzz::Attr(in, 6);
  const int num_tables = in.ConsumeIntegralInRange<int>(0, 4);
  for (int t = 0; t < num_tables; ++t) {
    chunks.widths.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 9)
                                             : sce_fuzz::Attr(in, 9));
  }
  chunks.chunk = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 64)
                                  : sce_fuzz::Attr(in, 64);
  // Counts exist for at most 6 replicas; a larger claim is only validated if the counts hold it.
  const int64_t stored = chunks.num_replicas >= 1 && chunks.num_replicas <= 6
                             ? chunks.num_replicas : 0;
  std::vector<int32_t> counts(stored * num_tables);
  for (int32_t& c : counts) c = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(0, 5)
                                                 : sce_fuzz::Id(in, 8);
  if (stored == 0) return 0;
  chunks.counts = counts.data();
  std::vector<int64_t> rows;
  if (!sce::ValidateReplicaChunks(chunks, "fuzz", &rows).ok()) return 0;
  SCE_FUZZ_CHECK(static_cast<int>(rows.size()) == num_tables);
  SCE_FUZZ_CHECK(chunks.num_replicas * chunks.chunk <= (int64_t{1} << 28));
  // Accepted buffers of up to 1 GiB are fine for the op; copying them here only slows fuzzing.
  if (chunks.num_replicas * chunks.chunk > (int64_t{1} << 16)) return 0;
  std::vector<std::vector<uint32_t>> tables(num_tables), back(num_tables);
  std::vector<const uint32_t*> in_ptrs;
  std::vector<uint32_t*> out_ptrs;
  uint32_t next = 1;
  for (int t = 0; t < num_tables; ++t) {
    tables[t].resize(rows[t] * chunks.widths[t]);
    for (uint32_t& v : tables[t]) v = next++;
    back[t].assign(tables[t].size(), 0);
    in_ptrs.push_back(tables[t].data());
    out_ptrs.push_back(back[t].data());
  }
  constexpr uint32_t kUnwritten = 0xFFFFFFFFu;  // never a value (values count up from 1)
  std::vector<uint32_t> buffer(chunks.num_replicas * chunks.chunk, kUnwritten);
  sce::PackReplicaChunks(chunks, in_ptrs, buffer.data());
  sce::UnpackReplicaChunks(chunks, buffer.data(), out_ptrs);
  for (int t = 0; t < num_tables; ++t) SCE_FUZZ_CHECK(back[t] == tables[t]);
  // Every element of the buffer is written: a value or zero padding.
  for (uint32_t v : buffer) SCE_FUZZ_CHECK(v != kUnwritten);

  // Gathered: table t's entries are rows of a source one row longer, read in reverse order
  // (skipped when a source row alone is large: a table of no entries may be very wide).
  for (int t = 0; t < num_tables; ++t) {
    if ((rows[t] + 1) * chunks.widths[t] > (int64_t{1} << 16)) return 0;
  }
  std::vector<std::vector<uint32_t>> sources(num_tables);
  std::vector<std::vector<int32_t>> indices(num_tables);
  std::vector<sce::GatheredTable> gathered(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const int64_t width = chunks.widths[t];
    sources[t].assign((rows[t] + 1) * width, 0);
    for (int64_t k = 0; k < rows[t]; ++k) {
      indices[t].push_back(static_cast<int32_t>(rows[t] - k));
      for (int64_t d = 0; d < width; ++d) {
        sources[t][(rows[t] - k) * width + d] = tables[t][k * width + d];
      }
    }
    gathered[t] = {sources[t].data(), rows[t] + 1, indices[t].data()};
  }
  SCE_FUZZ_CHECK(sce::CheckGatherIndices(gathered, rows, "fuzz").ok());
  std::vector<uint32_t> from_gather(buffer.size(), kUnwritten);
  sce::PackGatheredReplicaChunks(chunks, gathered, from_gather.data());
  SCE_FUZZ_CHECK(from_gather == buffer);
  if (num_tables > 0 && rows[0] > 0) {
    indices[0][0] = static_cast<int32_t>(rows[0] + 1);   // one past the source
    SCE_FUZZ_CHECK(!sce::CheckGatherIndices(gathered, rows, "fuzz").ok());
  }

  // Padded unpack: multiples 1..4 by table.
  std::vector<int64_t> multiples, padded;
  for (int t = 0; t < num_tables; ++t) multiples.push_back(1 + t % 4);
  if (!sce::PaddedRows(chunks, rows, multiples, "fuzz", &padded).ok()) return 0;
  std::vector<std::vector<uint32_t>> wide(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    SCE_FUZZ_CHECK(padded[t] >= rows[t] && padded[t] % multiples[t] == 0 &&
                   padded[t] - rows[t] < multiples[t]);
    wide[t].assign(padded[t] * chunks.widths[t], kUnwritten);
    out_ptrs[t] = wide[t].data();
  }
  sce::UnpackReplicaChunks(chunks, buffer.data(), out_ptrs, padded);
  for (int t = 0; t < num_tables; ++t) {
    const size_t real = tables[t].size();
    SCE_FUZZ_CHECK(std::equal(tables[t].begin(), tables[t].end(), wide[t].begin()));
    for (size_t e = real; e < wide[t].size(); ++e) SCE_FUZZ_CHECK(wide[t][e] == 0);
  }
  return 0;
}
