// The CSR buffers that bench/kernel_ab.py's dump_criteo_csrs writes (the class's CSR of one batch
// of the 26-table workload, every stacked table), read back for the C++ harnesses that time the
// kernels on them (kernel_ab_main.cc, row_read_floor_main.cc), and the huge-page buffers those
// harnesses keep tables in, as the library backs large tables (cc/core/huge_pages.h).
#ifndef SCE_BENCH_CSR_DUMP_H_
#define SCE_BENCH_CSR_DUMP_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cc/core/csr_view.h"

namespace sce_bench {

// A zero-filled buffer on transparent huge pages, as the library asks for large tables (madvise
// needs a page-aligned start, which std::vector's storage does not have).
struct HugeBuffer {
  float* data = nullptr;
  explicit HugeBuffer(size_t floats) {
    if (floats == 0) return;
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t bytes = (floats * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
    data = static_cast<float*>(std::aligned_alloc(kHugePage, bytes));
    if (data == nullptr) {
      std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
      std::exit(2);
    }
    madvise(data, bytes, MADV_HUGEPAGE);  // best effort
    std::memset(data, 0, bytes);
  }
  ~HugeBuffer() { std::free(data); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
};

struct Csr {
  std::vector<int32_t> row_pointers, samples, tokens;
  std::vector<float> gains;
  sce::CsrView view;
  int64_t dim = 32;
  std::vector<int64_t> feature_rows;  // each feature's samples per SparseCore, in order
  // Each member table's first row in a shard and shard rotation, in row order (the 16-bit
  // update's rounding walks them).
  std::vector<int64_t> member_rows, member_rotations;
};

// Reads the stacked tables' CSR buffers written by kernel_ab.py (dump_criteo_csrs).
inline std::vector<Csr> ReadCsrs(const char* path) {
  FILE* file = std::fopen(path, "rb");
  if (file == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", path);
    std::exit(2);
  }
  auto read = [file, path](void* to, size_t bytes) {
    if (std::fread(to, 1, bytes, file) != bytes) {
      std::fprintf(stderr, "%s: truncated\n", path);
      std::exit(2);
    }
  };
  int64_t tables = 0;
  read(&tables, sizeof(tables));
  std::vector<Csr> csrs(tables);
  for (Csr& csr : csrs) {
    int64_t h[7];  // S, minibatches, input_size, table_rows, dim, row pointers, ids
    read(h, sizeof(h));
    csr.row_pointers.resize(h[5]);
    csr.samples.resize(h[6]);
    csr.tokens.resize(h[6]);
    csr.gains.resize(h[6]);
    read(csr.row_pointers.data(), h[5] * sizeof(int32_t));
    read(csr.samples.data(), h[6] * sizeof(int32_t));
    read(csr.tokens.data(), h[6] * sizeof(int32_t));
    read(csr.gains.data(), h[6] * sizeof(float));
    int64_t features = 0;
    read(&features, sizeof(features));
    if (features < 0 || features > h[2]) {  // at most one feature per activation row
      std::fprintf(stderr, "%s: bad feature count %lld\n", path, static_cast<long long>(features));
      std::exit(2);
    }
    csr.feature_rows.resize(features);
    read(csr.feature_rows.data(), features * sizeof(int64_t));
    int64_t members = 0;
    read(&members, sizeof(members));
    if (members < 1 || members > h[3]) {  // at least one member, at most one per table row
      std::fprintf(stderr, "%s: bad member count %lld\n", path, static_cast<long long>(members));
      std::exit(2);
    }
    std::vector<int64_t> pairs(2 * members);
    read(pairs.data(), pairs.size() * sizeof(int64_t));
    for (int64_t m = 0; m < members; ++m) {
      csr.member_rows.push_back(pairs[2 * m]);
      csr.member_rotations.push_back(pairs[2 * m + 1]);
    }
    sce::CsrView& v = csr.view;
    v.row_pointers = csr.row_pointers.data();
    v.num_row_pointers = h[5];
    v.sample_ids = csr.samples.data();
    v.token_ids = csr.tokens.data();
    v.gains = csr.gains.data();
    v.num_sample_ids = v.num_token_ids = v.num_gains = h[6];
    v.num_sc_per_device = h[0];
    v.num_minibatches = h[1];
    v.input_size = h[2];
    v.table_rows = h[3];
    v.table_name = "criteo";
    csr.dim = h[4];
  }
  std::fclose(file);
  return csrs;
}

}  // namespace sce_bench

#endif  // SCE_BENCH_CSR_DUMP_H_
