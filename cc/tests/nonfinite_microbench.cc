// Microbenchmark of the non-finite gradient check of the fused update (issue 10, item 5): the
// Adagrad update of one table shard set alone (printed as "before": the update loop is the same
// for finite inputs) against the same update preceded by the two AllFinite passes over the
// activation gradients and the gains that the kernel runs (printed as "after"). Single thread,
// best of N.
//
// Build and run with the op library's flags (setup.py COMMON_FLAGS):
//   g++ -std=c++17 -O3 -ffp-contract=off -fno-math-errno -I. cc/core/*.cc \
//       cc/tests/nonfinite_microbench.cc -o /tmp/nonfinite_microbench && /tmp/nonfinite_microbench
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/tests/fused_update_reference.h"

namespace {

// Batch 4096 on 4 SparseCores, 4 shards of `rows_per_shard` rows, ids_per_sample ids per sample.
struct Workload {
  std::vector<int32_t> row_pointers, samples, tokens;
  std::vector<float> gains, grads, table, accumulator;
  sce::CsrView view;
  int64_t dim;

  Workload(int64_t batch, int64_t dim_, int64_t rows_per_shard, int ids_per_sample) : dim(dim_) {
    const int64_t S = 4, P = 4, per_sc = batch / S;
    std::mt19937 rng(1);
    for (int64_t s = 0; s < S; ++s) {
      std::vector<std::vector<std::pair<int32_t, int32_t>>> by_shard(P);
      for (int64_t sample = 0; sample < per_sc; ++sample) {
        for (int k = 0; k < ids_per_sample; ++k) {
          const int32_t id = static_cast<int32_t>(rng() % (rows_per_shard * P));
          by_shard[id % P].push_back({id / static_cast<int32_t>(P), static_cast<int32_t>(sample)});
        }
      }
      for (int64_t p = 0; p < 8; ++p) {
        if (p < P) {
          std::sort(by_shard[p].begin(), by_shard[p].end());
          for (auto [token, sample] : by_shard[p]) {
            tokens.push_back(token);
            samples.push_back(sample);
            gains.push_back(1.0f / ids_per_sample);
          }
          while (tokens.size() % 8) {
            tokens.push_back(sce::kPad);
            samples.push_back(sce::kPad);
            gains.push_back(static_cast<float>(sce::kPad));
          }
        }
        row_pointers.push_back(static_cast<int32_t>(tokens.size()));
      }
    }
    grads.resize(batch * dim);
    for (float& g : grads) g = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
    table.assign(rows_per_shard * P * dim, 0.01f);
    accumulator.assign(table.size(), 0.1f);
    sce_testing::BindCsrBuffers(row_pointers, samples, tokens, gains, &view);
    view.num_sc_per_device = S;
    view.input_size = batch;
    view.table_rows = rows_per_shard * P;
    view.table_name = "bench";
  }
};

template <typename Fn>
double BestMicroseconds(Fn fn, int repetitions) {
  double best = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(stop - start).count());
  }
  return best;
}

}  // namespace

int main() {
  std::printf("| batch | dim | ids/sample | update only (us) | AllFinite passes (us) | "
              "update + check (us) | overhead |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t dim : {8, 32, 128}) {
    Workload w(4096, dim, 25000, 4);
    if (!sce::ValidateCsrView(w.view).ok()) return 1;
    const float hypers[1] = {0.0f};
    auto update = [&] {
      sce::FusedUpdate<sce::AdagradOptimizer>(w.view, sce::GradientRows::InCsrOrder(w.view, w.grads.data(), dim),
                                              dim, 1e-6f, hypers,
                                              sce::Clip(), w.table.data(),
                                              std::array<float*, 1>{w.accumulator.data()},
                                              sce::RunSerially);
    };
    volatile bool sink = true;
    auto check = [&] {
      sink = sce::AllFinite(w.grads.data(), static_cast<int64_t>(w.grads.size())) &&
             sce::AllFinite(w.view.gains, w.view.num_gains);
    };
    const double u = BestMicroseconds(update, 30);
    const double c = BestMicroseconds(check, 30);
    const double both = BestMicroseconds([&] { check(); update(); }, 30);
    std::printf("| 4096 | %lld | 4 | %.0f | %.1f | %.0f | %+.1f%% |\n",
                static_cast<long long>(dim), u, c, both, 100.0 * (both - u) / u);
  }
  return 0;
}
