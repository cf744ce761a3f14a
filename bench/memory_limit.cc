// What this machine's memory allows for the kernels' access patterns (issue 8, item 2), built and
// run by bench/memory_limit.py. Each probe is the memory traffic of one kernel with the least
// possible work around it, written the way the kernels are (sorted rows, software prefetch, huge
// pages for the tables), so a kernel's time divided by its probe's is how far it is from the
// limit:
//
//   rows         read-modify-write of `distinct` table rows (plus `slots` slot rows each), in
//                increasing row order: the fused update's per-row optimizer step;
//   gradients    `ids` reads of a random gradient row, gain-scaled and summed: the fused update's
//                per-contribution accumulation;
//   forward      `ids` reads of a table row (drawn from `distinct` rows, sorted by row) added
//                into a random activation row: the forward lookup.
//
// Every probe runs `calls` times and prints the median, once with the same rows each call (as
// bench_kernels, which repeats one batch, so hot rows stay in cache) and once with fresh random
// rows each call (a new batch every step, as in training). Rows are drawn uniformly, which is
// colder than the Zipf ids of the workload.
//
// Usage: memory_limit <table_rows> <distinct_rows> <ids> <activation_rows> <dim> <calls>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kRowPrefetchDistance = 8;
constexpr int kGradientPrefetchDistance = 8;

float* AllocateHuge(int64_t floats) {
  const size_t bytes = ((static_cast<size_t>(floats) * sizeof(float)) + (2u << 20) - 1) &
                       ~((size_t{2} << 20) - 1);
  void* p = std::aligned_alloc(size_t{2} << 20, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);  // best effort, as cc/core/huge_pages.cc
  std::memset(p, 0, bytes);
  return static_cast<float*>(p);
}

inline void Prefetch(const float* p, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(p) + line);
  }
}

double Milliseconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Probe {
  int64_t table_rows, distinct, ids, activation_rows, dim, calls;
  float* table;
  float* slot;
  float* gradients;
  float* activations;
  std::mt19937_64 rng{12345};

  std::vector<int64_t> SortedRows(int64_t n) {
    std::vector<int64_t> rows(n);
    for (int64_t& r : rows) r = static_cast<int64_t>(rng() % table_rows);
    std::sort(rows.begin(), rows.end());
    return rows;
  }

  // `ids` rows drawn from `distinct` random rows, sorted: a batch's ids of one shard in the
  // CSR's order.
  std::vector<int64_t> SortedIds() {
    const std::vector<int64_t> rows = SortedRows(distinct);
    std::vector<int64_t> ids_rows(ids);
    for (int64_t& r : ids_rows) r = rows[rng() % rows.size()];
    std::sort(ids_rows.begin(), ids_rows.end());
    return ids_rows;
  }

  // Adagrad-like per-row step on the table row and `slots` (0 or 1) slot rows.
  double Rows(const std::vector<int64_t>& rows, int slots) {
    const int64_t row_bytes = dim * 4;
    std::vector<float> g(dim, 0.01f);
    const auto start = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i) {
      if (i + kRowPrefetchDistance < n) {
        Prefetch(table + rows[i + kRowPrefetchDistance] * dim, row_bytes);
        if (slots) Prefetch(slot + rows[i + kRowPrefetchDistance] * dim, row_bytes);
      }
      float* w = table + rows[i] * dim;
      if (slots) {
        float* a = slot + rows[i] * dim;
        for (int64_t j = 0; j < dim; ++j) {
          a[j] += g[j] * g[j];
          w[j] -= 0.05f * g[j] / std::sqrt(a[j] + 1.0f);
        }
      } else {
        for (int64_t j = 0; j < dim; ++j) w[j] -= 0.05f * g[j];
      }
    }
    return Milliseconds(start);
  }

  // Sums of gain-scaled random gradient rows, one sum per 5 contributions (about the workload's
  // contributions per distinct row).
  double Gradients(const std::vector<int32_t>& samples) {
    const int64_t row_bytes = dim * 4;
    std::vector<float> sum(dim, 0.0f);
    float sink = 0.0f;
    const auto start = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(samples.size());
    for (int64_t i = 0; i < n; ++i) {
      if (i + kGradientPrefetchDistance < n) {
        Prefetch(gradients + int64_t{samples[i + kGradientPrefetchDistance]} * dim, row_bytes);
      }
      const float* r = gradients + int64_t{samples[i]} * dim;
      for (int64_t j = 0; j < dim; ++j) sum[j] += 0.5f * r[j];
      if (i % 5 == 4) {
        sink += sum[0];
        std::fill(sum.begin(), sum.end(), 0.0f);
      }
    }
    const double ms = Milliseconds(start);
    if (sink == 12345.0f) std::puts("");  // keeps the sums alive
    return ms;
  }

  // Table rows in row order, each added into a random activation row.
  double Forward(const std::vector<int64_t>& rows, const std::vector<int32_t>& samples) {
    const int64_t row_bytes = dim * 4;
    const auto start = std::chrono::steady_clock::now();
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i) {
      if (i + kRowPrefetchDistance < n) {
        Prefetch(table + rows[i + kRowPrefetchDistance] * dim, row_bytes);
        Prefetch(activations + int64_t{samples[i + kRowPrefetchDistance]} * dim, row_bytes);
      }
      const float* r = table + rows[i] * dim;
      float* out = activations + int64_t{samples[i]} * dim;
      for (int64_t j = 0; j < dim; ++j) out[j] += 0.5f * r[j];
    }
    return Milliseconds(start);
  }

  std::vector<int32_t> RandomSamples(int64_t n) {
    std::vector<int32_t> s(n);
    for (int32_t& x : s) x = static_cast<int32_t>(rng() % activation_rows);
    return s;
  }

  // Median over `calls` of probe(), with the same inputs each call or fresh ones.
  template <typename MakeInputs, typename Run>
  void Report(const char* name, MakeInputs make_inputs, Run run) {
    for (bool fresh : {false, true}) {
      auto inputs = make_inputs();
      run(inputs);  // warm-up
      std::vector<double> ms;
      for (int64_t c = 0; c < calls; ++c) {
        if (fresh) inputs = make_inputs();
        ms.push_back(run(inputs));
      }
      std::printf("%s\t%s\t%.3f\n", name, fresh ? "fresh" : "same", Median(ms));
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: %s table_rows distinct_rows ids activation_rows dim calls\n", argv[0]);
    return 2;
  }
  Probe p;
  p.table_rows = std::atoll(argv[1]);
  p.distinct = std::atoll(argv[2]);
  p.ids = std::atoll(argv[3]);
  p.activation_rows = std::atoll(argv[4]);
  p.dim = std::atoll(argv[5]);
  p.calls = std::atoll(argv[6]);
  if (p.table_rows < 1 || p.distinct < 1 || p.ids < 1 || p.activation_rows < 1 || p.dim < 1 ||
      p.dim > 4096 || p.calls < 1 || p.activation_rows > INT32_MAX) {
    std::fprintf(stderr, "arguments must be positive (dim <= 4096)\n");
    return 2;
  }
  p.table = AllocateHuge(p.table_rows * p.dim);
  p.slot = AllocateHuge(p.table_rows * p.dim);
  p.gradients = AllocateHuge(p.activation_rows * p.dim);
  p.activations = AllocateHuge(p.activation_rows * p.dim);
  std::printf("probe\trows\tms\n");
  p.Report("rows, SGD (table)", [&] { return p.SortedRows(p.distinct); },
           [&](const std::vector<int64_t>& rows) { return p.Rows(rows, 0); });
  p.Report("rows, Adagrad (table + slot)", [&] { return p.SortedRows(p.distinct); },
           [&](const std::vector<int64_t>& rows) { return p.Rows(rows, 1); });
  p.Report("gradients", [&] { return p.RandomSamples(p.ids); },
           [&](const std::vector<int32_t>& samples) { return p.Gradients(samples); });
  p.Report("forward",
           [&] { return std::make_pair(p.SortedIds(), p.RandomSamples(p.ids)); },
           [&](const std::pair<std::vector<int64_t>, std::vector<int32_t>>& in) {
             return p.Forward(in.first, in.second);
           });
  return 0;
}
