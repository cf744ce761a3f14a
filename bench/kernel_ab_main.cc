// In-process A/B timing of two builds of the core kernels (bench/kernel_ab.py builds and runs
// it). On the project's shared 2-vCPU VMs, separate runs of one build differ by 20-30%; calls of
// two builds alternated in one process see the same machine state, so differences of 2-3% show.
// Each round calls A then B, or B then A (alternating), on the same inputs.
//
// The input is a CSR of one replica (4 SparseCores, 4 shards, one minibatch) shaped like one
// stacked table of the benchmark workload: `features` features of batch 4096 stacked into a
// `rows`-row table, `ids` entries drawn from `distinct` rows (skewed, as Criteo-like ids are), each
// feature's ids in its own rows and samples. Both builds' forward outputs must be bit-identical
// (checked every call).
//
// The updates' gradients come in the CSR's order (one buffer) or, with `per-feature`, as the class
// passes them with one replica: one [batch, dim] buffer per feature, read feature-major
// (cc/core/activation_rows.h). A table that cannot be read feature-major (one feature, or no
// feature rows in the dump) keeps the CSR's order, as in the class.
//
// The kernel argument names one kernel for both builds, or two as "A:B" (for instance
// "adagrad:adagrad-bf16", float32 against bfloat16 rows, usually with one tree as both builds).
// The `-bf16` kernels read and write a bfloat16 copy of the table. Outputs are compared only when
// both sides run the same kernel.
//
// Usage: kernel_ab_main <a.so> <b.so> <kernel[:kernel]> <calls> <csr|per-feature>
//                       [csr file from kernel_ab.py]
// kernel: forward, adagrad, sgd, forward-bf16 or adagrad-bf16.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/core/activation_rows.h"
#include "cc/core/constants.h"
#include "cc/core/csr_view.h"
#include "bench/csr_dump.h"

namespace {

using sce_bench::Csr;
using sce_bench::HugeBuffer;
using sce_bench::ReadCsrs;

using Forward = void (*)(const sce::CsrView*, const void*, int64_t, float*);
// The fused updates (Adagrad, SGD): view, gradient buffers and their count, each feature's rows
// per SparseCore and their count (0: the CSR's order), dim, table, accumulator (unused by SGD),
// and the member tables' first rows and rotations and their count (used by the 16-bit update).
using Update = void (*)(const sce::CsrView*, const float* const*, int64_t, const int64_t*, int64_t,
                        int64_t, void*, float*, const int64_t*, const int64_t*, int64_t);

// One kernel of the harness: its entry point in kernel_ab_build.cc and what it reads.
struct Kernel {
  const char* name;
  const char* symbol;
  bool forward;      // a lookup (else a fused update)
  bool accumulator;  // an update with an Adagrad accumulator
  bool bfloat16;     // reads the bfloat16 copy of the table
};
constexpr Kernel kKernels[] = {
    {"forward", "KernelAbForward", true, false, false},
    {"adagrad", "KernelAbAdagrad", false, true, false},
    {"sgd", "KernelAbSgd", false, false, false},
    {"forward-bf16", "KernelAbForwardBfloat16", true, false, true},
    {"adagrad-bf16", "KernelAbAdagradBfloat16", false, true, true},
};

const Kernel* FindKernel(const std::string& name) {
  for (const Kernel& k : kKernels) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

void* Symbol(const char* library, const char* name) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    std::exit(2);
  }
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    std::fprintf(stderr, "%s: no %s\n", library, name);
    std::exit(2);
  }
  return symbol;
}

Csr MakeCsr(int64_t rows, int64_t distinct, int64_t ids, int64_t samples, int64_t features,
            uint64_t seed) {
  constexpr int64_t kSparseCores = 4, kBlock = 8;  // block: shards rounded up to 8
  const int64_t rows_per_shard = rows / kSparseCores, samples_per_sc = samples / kSparseCores;
  const int64_t rows_per_feature = rows_per_shard * kSparseCores / features;
  const int64_t distinct_per_feature = std::max<int64_t>(1, distinct / features);
  const int64_t samples_per_feature = samples_per_sc / features;
  std::mt19937_64 rng(seed);
  // As in a stacked table: feature f owns a contiguous range of the stacked rows and of each
  // SparseCore's samples; row r lives in shard r % 4 at token r / 4.
  std::vector<int64_t> hot(distinct_per_feature * features);
  for (int64_t f = 0; f < features; ++f) {
    for (int64_t k = 0; k < distinct_per_feature; ++k) {
      hot[f * distinct_per_feature + k] =
          f * rows_per_feature + static_cast<int64_t>(rng() % rows_per_feature);
    }
  }
  std::exponential_distribution<double> skew(8.0 / static_cast<double>(distinct_per_feature));
  Csr csr;
  for (int64_t s = 0; s < kSparseCores; ++s) {
    // (shard, token, sample) of this SparseCore's ids, sorted by shard then token.
    std::vector<std::array<int32_t, 3>> entries;
    for (int64_t f = 0; f < features; ++f) {
      for (int64_t k = 0; k < ids / (kSparseCores * features); ++k) {
        const int64_t pick = std::min<int64_t>(distinct_per_feature - 1,
                                               static_cast<int64_t>(skew(rng)));
        const int64_t row = hot[f * distinct_per_feature + pick];
        entries.push_back({static_cast<int32_t>(row % kSparseCores),
                           static_cast<int32_t>(row / kSparseCores),
                           static_cast<int32_t>(f * samples_per_feature +
                                                static_cast<int64_t>(rng() % samples_per_feature))});
      }
    }
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      return a[0] != b[0] ? a[0] < b[0] : a[1] < b[1];
    });
    size_t next = 0;
    for (int64_t p = 0; p < kBlock; ++p) {
      for (; next < entries.size() && entries[next][0] == p; ++next) {
        csr.tokens.push_back(entries[next][1]);
        csr.samples.push_back(entries[next][2]);
        csr.gains.push_back(0.5f);
      }
      csr.row_pointers.push_back(static_cast<int32_t>(csr.tokens.size()));
      while (csr.tokens.size() % kBlock != 0) {
        csr.tokens.push_back(sce::kPad);
        csr.samples.push_back(sce::kPad);
        csr.gains.push_back(static_cast<float>(sce::kPad));
      }
    }
  }
  sce::CsrView& v = csr.view;
  v.row_pointers = csr.row_pointers.data();
  v.num_row_pointers = static_cast<int64_t>(csr.row_pointers.size());
  v.sample_ids = csr.samples.data();
  v.token_ids = csr.tokens.data();
  v.gains = csr.gains.data();
  v.num_sample_ids = v.num_token_ids = v.num_gains = static_cast<int64_t>(csr.tokens.size());
  v.num_sc_per_device = kSparseCores;
  v.input_size = samples_per_sc * kSparseCores;
  v.table_rows = rows_per_shard * kSparseCores;
  v.table_name = "ab";
  csr.feature_rows.assign(features, samples_per_feature);
  for (int64_t f = 0; f < features; ++f) {  // one member table per feature, of equal heights
    csr.member_rows.push_back(rows_per_shard * f / features);
    csr.member_rotations.push_back(f % kSparseCores);
  }
  return csr;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One stacked table's buffers: its table (float32, and a bfloat16 copy when a kernel reads one),
// its Adagrad accumulator, gradients (one buffer, or one per feature) and both builds' activations.
struct TableState {
  HugeBuffer table, accumulator, narrow_table;
  std::vector<float> activations[2];
  std::vector<std::vector<float>> gradients;
  std::vector<const float*> gradient_parts;
  bool per_feature;  // one gradient buffer per feature, else one in the CSR's order
  TableState(const Csr& csr, bool forward, bool accumulator_too, bool bfloat16_too,
             bool per_feature, std::mt19937* rng)
      : table(csr.view.table_rows * csr.dim),
        accumulator(accumulator_too ? csr.view.table_rows * csr.dim : 0),
        narrow_table(bfloat16_too ? (csr.view.table_rows * csr.dim + 1) / 2 : 0),
        per_feature(per_feature) {
    std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
    const int64_t floats = csr.view.table_rows * csr.dim;
    for (int64_t i = 0; i < floats; ++i) table.data[i] = uniform(*rng);
    if (bfloat16_too) {  // the upper halves of the float32 values (truncated: any values will do)
      uint16_t* narrow = reinterpret_cast<uint16_t*>(narrow_table.data);
      for (int64_t i = 0; i < floats; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &table.data[i], sizeof(bits));
        narrow[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
    if (forward) {
      activations[0].assign(csr.view.input_size * csr.dim, 0.0f);
      activations[1].assign(csr.view.input_size * csr.dim, 0.0f);
    } else {
      if (accumulator_too) std::fill(accumulator.data, accumulator.data + floats, 0.1f);
      if (per_feature) {
        for (int64_t rows : csr.feature_rows) {
          gradients.emplace_back(csr.view.num_source_sparse_cores() * rows * csr.dim);
        }
      } else {
        gradients.emplace_back(csr.view.input_size * csr.dim);
      }
      for (auto& part : gradients) {
        for (float& g : part) g = uniform(*rng);
        gradient_parts.push_back(part.data());
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s a.so b.so kernel[:kernel] calls csr|per-feature [csr file]\n",
                 argv[0]);
    return 2;
  }
  const std::string kernel_names = argv[3];
  const size_t colon = kernel_names.find(':');
  const Kernel* kernels[2] = {
      FindKernel(kernel_names.substr(0, colon)),
      FindKernel(colon == std::string::npos ? kernel_names : kernel_names.substr(colon + 1))};
  if (kernels[0] == nullptr || kernels[1] == nullptr ||
      kernels[0]->forward != kernels[1]->forward) {
    std::fprintf(stderr, "unknown kernels %s (or a lookup against an update)\n", argv[3]);
    return 2;
  }
  const bool forward = kernels[0]->forward;
  const bool adagrad = kernels[0]->accumulator || kernels[1]->accumulator;
  const bool bfloat16 = kernels[0]->bfloat16 || kernels[1]->bfloat16;
  const bool same_kernel = kernels[0] == kernels[1];
  const int calls = std::atoi(argv[4]);
  const bool per_feature = std::strcmp(argv[5], "per-feature") == 0;
  if (!per_feature && std::strcmp(argv[5], "csr") != 0) {
    std::fprintf(stderr, "unknown gradient order %s\n", argv[5]);
    return 2;
  }
  std::vector<Csr> csrs;
  if (argc > 6) {
    csrs = ReadCsrs(argv[6]);
  } else {
    // The sizes of the 26-table workload at vocabulary cap 4M (bench_kernels prints them).
    csrs.push_back(MakeCsr(18771904, 59646, 319886, 4096 * 26, 26, 1));
  }
  int64_t ids = 0, rows = 0;
  std::vector<std::unique_ptr<TableState>> states;
  std::mt19937 rng(2);
  for (const Csr& csr : csrs) {
    if (const sce::Status status = sce::ValidateCsrView(csr.view); !status.ok()) {
      std::fprintf(stderr, "bad CSR: %s\n", status.message().c_str());
      return 2;
    }
    ids += csr.view.num_token_ids;
    rows += csr.view.table_rows;
    const bool table_per_feature = per_feature && csr.feature_rows.size() >= 2;
    if (per_feature && !table_per_feature) {
      std::printf("table %zu: read in the CSR's order (not feature-major)\n", states.size());
    }
    if (table_per_feature) {
      if (const sce::Status status = sce::ValidateFeatureRows(csr.feature_rows, csr.view);
          !status.ok()) {
        std::fprintf(stderr, "bad feature rows: %s\n", status.message().c_str());
        return 2;
      }
    }
    states.push_back(
        std::make_unique<TableState>(csr, forward, adagrad, bfloat16, table_per_feature, &rng));
  }
  void* fns[2];
  for (int k = 0; k < 2; ++k) {
    fns[k] = Symbol(argv[1 + k], kernels[k]->symbol);
  }
  std::vector<double> ms[2];
  int b_faster = 0;
  constexpr int kWarmUp = 5;
  for (int c = 0; c < calls + kWarmUp; ++c) {
    double t[2];
    for (int i = 0; i < 2; ++i) {
      const int k = (c % 2 == 0) ? i : 1 - i;
      const auto start = std::chrono::steady_clock::now();
      for (size_t n = 0; n < csrs.size(); ++n) {
        TableState& st = *states[n];
        void* table = kernels[k]->bfloat16 ? static_cast<void*>(st.narrow_table.data)
                                           : static_cast<void*>(st.table.data);
        if (forward) {
          reinterpret_cast<Forward>(fns[k])(&csrs[n].view, table, csrs[n].dim,
                                            st.activations[k].data());
        } else {
          const std::vector<int64_t>& rows = csrs[n].feature_rows;
          reinterpret_cast<Update>(fns[k])(
              &csrs[n].view, st.gradient_parts.data(),
              static_cast<int64_t>(st.gradient_parts.size()), rows.data(),
              st.per_feature ? static_cast<int64_t>(rows.size()) : 0, csrs[n].dim, table,
              st.accumulator.data, csrs[n].member_rows.data(), csrs[n].member_rotations.data(),
              static_cast<int64_t>(csrs[n].member_rows.size()));
        }
      }
      t[k] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count();
    }
    for (const auto& st : states) {
      if (forward && same_kernel && std::memcmp(st->activations[0].data(), st->activations[1].data(),
                                 st->activations[0].size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "the two builds' activations differ\n");
        return 1;
      }
    }
    if (c < kWarmUp) continue;
    ms[0].push_back(t[0]);
    ms[1].push_back(t[1]);
    b_faster += t[1] < t[0];
  }
  const double a = Median(ms[0]), b = Median(ms[1]);
  std::printf("%s (%s gradients), %s workload, %zu tables, %lld entries (with padding), %lld "
              "rows, %d rounds: A %.3f ms, B %.3f ms (medians), B/A %.3f, B faster in %d of %d "
              "rounds\n",
              argv[3], forward ? "no" : argv[5], argc > 6 ? "criteo" : "synthetic", csrs.size(),
              static_cast<long long>(ids), static_cast<long long>(rows), calls, a, b, b / a,
              b_faster, calls);
  return 0;
}
