// In-process A/B timing of two builds of the core kernels (bench/kernel_ab.py builds and runs
// it). On a noisy VM, separate runs of one build differ by 20-30% (BENCHMARKS.md, eighth round);
// calls of two builds alternated in one process see the same machine state, so differences of
// 2-3% show. Each round calls A then B, or B then A (alternating), on the same inputs.
//
// The input is a CSR of one replica (4 SparseCores, 4 shards, one minibatch) with the
// benchmark workload's sizes: `ids` entries drawn from `distinct` rows (skewed, as Criteo-like
// ids are) of a `rows`-row table, onto `samples` activation rows. Both builds' forward outputs
// must be bit-identical (checked every call).
//
// Usage: kernel_ab_main <a.so> <b.so> <forward|adagrad> <calls> [rows distinct ids samples dim]
#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/csr_view.h"

namespace {

using Forward = void (*)(const sce::CsrView*, const float*, int64_t, float*);
using Adagrad = void (*)(const sce::CsrView*, const float*, int64_t, float*, float*);

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

// A zero-filled buffer on transparent huge pages (as the library asks for large tables).
std::vector<float> HugeBuffer(size_t floats) {
  std::vector<float> v(floats);
  madvise(v.data(), floats * sizeof(float), MADV_HUGEPAGE);
  return v;
}

struct Csr {
  std::vector<int32_t> row_pointers, samples, tokens;
  std::vector<float> gains;
  sce::CsrView view;
};

Csr MakeCsr(int64_t rows, int64_t distinct, int64_t ids, int64_t samples, uint64_t seed) {
  constexpr int64_t kSparseCores = 4, kBlock = 8;  // block: shards rounded up to 8
  const int64_t rows_per_shard = rows / kSparseCores, samples_per_sc = samples / kSparseCores;
  std::mt19937_64 rng(seed);
  std::vector<int64_t> hot(distinct);
  for (int64_t& h : hot) h = static_cast<int64_t>(rng() % (rows_per_shard * kSparseCores));
  std::exponential_distribution<double> skew(8.0 / static_cast<double>(distinct));
  Csr csr;
  for (int64_t s = 0; s < kSparseCores; ++s) {
    // (shard, token, sample) of this SparseCore's ids, sorted by shard then token.
    std::vector<std::array<int32_t, 3>> entries(ids / kSparseCores);
    for (auto& e : entries) {
      const int64_t row = hot[std::min<int64_t>(distinct - 1, static_cast<int64_t>(skew(rng)))];
      e = {static_cast<int32_t>(row / rows_per_shard), static_cast<int32_t>(row % rows_per_shard),
           static_cast<int32_t>(rng() % samples_per_sc)};
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
  return csr;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s a.so b.so forward|adagrad calls [rows distinct ids samples dim]\n",
                 argv[0]);
    return 2;
  }
  const bool forward = std::strcmp(argv[3], "forward") == 0;
  const int calls = std::atoi(argv[4]);
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  // Defaults: the 26-table workload at vocabulary cap 4M (bench_kernels prints these sizes).
  const int64_t rows = arg(5, 18771904), distinct = arg(6, 59646), ids = arg(7, 319886),
                samples = arg(8, 4096 * 26), dim = arg(9, 32);
  const Csr csr = MakeCsr(rows, distinct, ids, samples, 1);
  if (const sce::Status status = sce::ValidateCsrView(csr.view); !status.ok()) {
    std::fprintf(stderr, "bad CSR: %s\n", status.message().c_str());
    return 2;
  }
  const int64_t table_floats = csr.view.table_rows * dim;
  std::vector<float> table = HugeBuffer(table_floats);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  for (float& w : table) w = uniform(rng);
  std::vector<float> accumulator, gradients, activations[2];
  if (forward) {
    activations[0].assign(csr.view.input_size * dim, 0.0f);
    activations[1].assign(csr.view.input_size * dim, 0.0f);
  } else {
    accumulator = HugeBuffer(table_floats);
    std::fill(accumulator.begin(), accumulator.end(), 0.1f);
    gradients.resize(csr.view.input_size * dim);
    for (float& g : gradients) g = uniform(rng);
  }
  void* fns[2];
  for (int k = 0; k < 2; ++k) {
    fns[k] = Symbol(argv[1 + k], forward ? "KernelAbForward" : "KernelAbAdagrad");
  }
  std::vector<double> ms[2];
  int b_faster = 0;
  constexpr int kWarmUp = 5;
  for (int c = 0; c < calls + kWarmUp; ++c) {
    double t[2];
    for (int i = 0; i < 2; ++i) {
      const int k = (c % 2 == 0) ? i : 1 - i;
      const auto start = std::chrono::steady_clock::now();
      if (forward) {
        reinterpret_cast<Forward>(fns[k])(&csr.view, table.data(), dim, activations[k].data());
      } else {
        reinterpret_cast<Adagrad>(fns[k])(&csr.view, gradients.data(), dim, table.data(),
                                          accumulator.data());
      }
      t[k] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count();
    }
    if (forward && std::memcmp(activations[0].data(), activations[1].data(),
                               activations[0].size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "the two builds' activations differ\n");
      return 1;
    }
    if (c < kWarmUp) continue;
    ms[0].push_back(t[0]);
    ms[1].push_back(t[1]);
    b_faster += t[1] < t[0];
  }
  const double a = Median(ms[0]), b = Median(ms[1]);
  std::printf("%s, %lld ids, %lld rows, dim %lld, %d rounds: A %.3f ms, B %.3f ms (medians), "
              "B/A %.3f, B faster in %d of %d rounds\n",
              argv[3], static_cast<long long>(ids), static_cast<long long>(rows),
              static_cast<long long>(dim), calls, a, b, b / a, b_faster, calls);
  return 0;
}
