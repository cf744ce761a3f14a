// libFuzzer target: sce::ValidateOwnerCsr + sce::BuildOwnerCsr (cc/core/owner_csr.h) with
// arbitrary shard arguments and rows. Whatever is accepted must write only within the validated
// sizes (ASan) and give a CSR whose entries are exactly the rows, each once, in valid segments,
// entry i read from activation row i (sample i mod M of source SparseCore i div M).
#include <cstdint>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/owner_csr.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  sce::OwnerCsrParams p;
  p.num_replicas = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 5) : sce_fuzz::Attr(in, 5);
  p.sparse_cores_per_replica =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 4) : sce_fuzz::Attr(in, 4);
  p.rows_per_shard = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 30)
                                      : sce_fuzz::Attr(in, 30);
  p.replica_id = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 4) : sce_fuzz::Attr(in, 4);
  std::vector<int32_t> rows = sce_fuzz::Ids(in, 200, 120);
  const int64_t n = static_cast<int64_t>(rows.size());
  sce::OwnerCsrSizes sizes;
  if (!sce::ValidateOwnerCsr(p, rows.data(), n, "fuzz", &sizes).ok()) return 0;
  // Keep the fuzzing fast: accepted sizes up to 2^28 are fine for the op.
  if (sizes.row_pointers > (1 << 16) || sizes.entries > (1 << 16)) return 0;
  std::vector<int32_t> pointers(sizes.row_pointers), samples(sizes.entries), tokens(sizes.entries);
  std::vector<float> gains(sizes.entries);
  sce::BuildOwnerCsr(p, rows.data(), n, sizes, pointers.data(), samples.data(), tokens.data(),
                     gains.data());
  // Walk the segments: key k of source SparseCore s holds entries of shard k - replica_id * S,
  // each reading activation row s * M + sample, which must be the index of a row of that shard.
  const int64_t S = p.sparse_cores_per_replica;
  const int64_t block = sizes.row_pointers / S;
  const int64_t M = sizes.activation_rows / S;
  std::vector<int> seen(n, 0);
  int64_t begin = 0;
  for (int64_t source = 0; source < S; ++source) {
    for (int64_t key = 0; key < block; ++key) {
      const int64_t end = pointers[source * block + key];
      const int64_t shard = key - p.replica_id * S;
      for (int64_t e = begin; e < end && e < sizes.entries; ++e) {
        SCE_FUZZ_CHECK(shard >= 0 && shard < S);
        const int64_t i = source * M + samples[e];
        SCE_FUZZ_CHECK(samples[e] >= 0 && samples[e] < M && i < n);
        SCE_FUZZ_CHECK(rows[i] == shard * p.rows_per_shard + tokens[e]);
        ++seen[i];
      }
      begin = (end + 7) / 8 * 8;
    }
  }
  for (int s : seen) SCE_FUZZ_CHECK(s == 1);
  int64_t real = 0;
  int32_t previous = 0;
  for (int32_t ptr : pointers) {
    SCE_FUZZ_CHECK(ptr >= previous && ptr <= sizes.entries);   // non-decreasing, in bounds
    previous = ptr;
  }
  for (int64_t e = 0; e < sizes.entries; ++e) {
    if (tokens[e] == sce::kPad) {
      SCE_FUZZ_CHECK(samples[e] == sce::kPad);
      continue;
    }
    ++real;
    SCE_FUZZ_CHECK(tokens[e] >= 0 && tokens[e] < p.rows_per_shard && gains[e] == 1.0f);
    SCE_FUZZ_CHECK(samples[e] >= 0 && samples[e] < sizes.activation_rows);
  }
  SCE_FUZZ_CHECK(real == n);
  return 0;
}
