// The floor under the forward lookup's time on the class's CSR of one workload batch, float32
// rows against bfloat16 rows (bench/row_read_floor.py builds and runs it; what it found:
// docs/lookup.md#what-bounds-the-lookup). Issue 33 asks 16-bit rows for a forward 1.2x faster
// than float32 ("half the bytes"). This harness measures, in one process on the same entries, how
// much of that the machine gives to each part of the lookup:
//
//   lookup       the library's forward lookup (sce::SparseDenseMatmul), as the lookup op runs it;
//   grouped sum  the lookup's own sums (sce::SumSampleMajorRows) on entries grouped by sample
//                beforehand: the lookup without its grouping, which does not depend on the dtype
//                (its activations must equal the lookup's, bit for bit: checked every round);
//   row lines    only the reads of each entry's table row, every cache line of it, with the same
//                prefetching and no arithmetic: what any lookup that reads the rows pays;
//   ... uniform  the last two with each entry's row replaced by a row drawn uniformly from the
//                whole stacked table, so nearly every read misses the caches: the case where the
//                bytes per row, not the latency per row, decide the time.
//
// Each round runs every measurement once with float32 and once with bfloat16 rows (alternating
// which goes first) over every stacked table. Threads: the SparseCore blocks are split over
// `threads` std::threads started per call, as an intra-op pool would run them (starting them
// costs the same for both dtypes).
//
// Usage: row_read_floor_main <csr file from bench/kernel_ab.py> <rounds> <threads>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/csr_dump.h"
#include "cc/core/csr_view.h"
#include "cc/core/lookup.h"
#include "cc/core/row_precision.h"
#include "cc/core/sample_major_order.h"
#include "cc/core/vector_isa.h"

namespace {

using sce_bench::Csr;
using sce_bench::HugeBuffer;

// One source SparseCore's valid entries grouped by sample (the library's SampleMajorOrder), and
// the first activation row of its block (SparseCore-major order).
struct Block {
  std::vector<uint32_t> rows;
  std::vector<float> gains;
  std::vector<int32_t> sample_begin;
  int64_t first_row = 0;
  sce::SampleMajorEntries entries() const {
    return {sample_begin.data(), rows.data(), gains.data()};
  }
};

// Reads one 32-bit word of every cache line of every entry's row, prefetched as the lookup's
// sample-major sum prefetches (sce::PrefetchRowAhead); returns their XOR so the reads cannot be
// dropped.
template <typename Row>
__attribute__((always_inline)) inline uint32_t RowLinesBody(const Block& block, const Row* table,
                                                            int64_t dim) {
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(Row));
  const int64_t lines = (row_bytes + 63) / 64;
  const uint32_t* entry_rows = block.rows.data();
  const int64_t n = block.sample_begin.back();
  const char* base = reinterpret_cast<const char*>(table);
  uint32_t sink = 0;
  for (int64_t k = 0; k < n; ++k) {
    sce::PrefetchRowAhead(entry_rows, k, n, table, dim);
    const char* row = base + static_cast<int64_t>(entry_rows[k]) * row_bytes;
    for (int64_t line = 0; line < lines; ++line) {
      uint32_t word;
      std::memcpy(&word, row + 64 * line, sizeof(word));
      sink ^= word;
    }
  }
  return sink;
}

// The lookup's sum on one grouped block (cc/core/lookup.h).
template <typename Row>
void GroupedSum(const Block& block, const Row* table, int64_t dim, float* activations) {
  sce::SumSampleMajorRows(block.entries(), static_cast<int64_t>(block.sample_begin.size()) - 1,
                          table, dim, activations, block.first_row, nullptr);
}

template <typename Row>
SCE_TARGET_AVX512 uint32_t RowLinesAvx512(const Block& block, const Row* table, int64_t dim) {
  return RowLinesBody<Row>(block, table, dim);
}

// Row reads in the widest instruction set the library uses here (its loads are whole lines).
template <typename Row>
uint32_t RowLines(const Block& block, const Row* table, int64_t dim) {
  static const bool avx512 = sce::BestVectorIsa() == sce::VectorIsa::kAvx512;
  return avx512 ? RowLinesAvx512<Row>(block, table, dim) : RowLinesBody<Row>(block, table, dim);
}

// Runs work(i) for i in [0, n) on `threads` threads (inline for one), each a contiguous range.
void RunOnThreads(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& work) {
  if (threads <= 1 || n <= 1) {
    work(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    if (begin < end) pool.emplace_back([&work, begin, end] { work(begin, end); });
  }
  for (std::thread& thread : pool) thread.join();
}

// One stacked table: its CSR, float32 table and bfloat16 copy, grouped blocks (as the workload's
// ids and with uniform rows), and each dtype's activations from the lookup, the grouped sum and
// the grouped sum of uniform rows.
struct Table {
  const Csr* csr;
  HugeBuffer wide, narrow;
  std::vector<Block> blocks, uniform_blocks;
  std::vector<float> lookup_out[2], sum_out[2], uniform_out[2];
  Table(const Csr& c, std::mt19937_64* rng)
      : csr(&c),
        wide(c.view.table_rows * c.dim),
        narrow((c.view.table_rows * c.dim + 1) / 2) {
    const int64_t values = c.view.table_rows * c.dim;
    std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
    uint16_t* halves = reinterpret_cast<uint16_t*>(narrow.data);
    for (int64_t i = 0; i < values; ++i) {
      wide.data[i] = uniform(*rng);
      uint32_t bits;
      std::memcpy(&bits, &wide.data[i], sizeof(bits));
      halves[i] = static_cast<uint16_t>(bits >> 16);  // any bfloat16 values will do
    }
    std::uniform_int_distribution<uint32_t> any_row(
        0, static_cast<uint32_t>(c.view.table_rows - 1));
    const int64_t samples_per_sc = c.view.samples_per_sc();
    for (int64_t s = 0; s < c.view.num_source_sparse_cores(); ++s) {
      sce::SampleMajorOrder order;
      if (!order.Build(c.view, s)) {
        std::fprintf(stderr, "out of memory grouping block %lld\n", static_cast<long long>(s));
        std::exit(2);
      }
      Block block;
      block.first_row = s * samples_per_sc;
      const sce::SampleMajorEntries grouped = order.entries();
      block.sample_begin.assign(grouped.sample_begin, grouped.sample_begin + samples_per_sc + 1);
      block.rows.assign(grouped.rows, grouped.rows + block.sample_begin.back());
      block.gains.assign(grouped.gains, grouped.gains + block.sample_begin.back());
      Block uniform_block = block;
      for (uint32_t& row : uniform_block.rows) row = any_row(*rng);
      blocks.push_back(std::move(block));
      uniform_blocks.push_back(std::move(uniform_block));
    }
    for (int k = 0; k < 2; ++k) {
      lookup_out[k].assign(c.view.input_size * c.dim, 0.0f);
      sum_out[k].assign(c.view.input_size * c.dim, 0.0f);
      uniform_out[k].assign(c.view.input_size * c.dim, 0.0f);
    }
  }
  const void* rows(bool bfloat16) const {
    return bfloat16 ? static_cast<const void*>(narrow.data) : static_cast<const void*>(wide.data);
  }
};

enum Measure { kLookup, kGroupedSum, kRowLines, kGroupedSumUniform, kRowLinesUniform, kMeasures };
const char* const kMeasureNames[kMeasures] = {"lookup", "grouped sum", "row lines",
                                              "grouped sum, uniform rows",
                                              "row lines, uniform rows"};

volatile uint32_t g_sink;

template <typename Row>
void RunOnce(Measure m, Table& t, int threads, int dtype) {
  const Csr& c = *t.csr;
  const Row* table = static_cast<const Row*>(t.rows(dtype == 1));
  if (m == kLookup) {
    const sce::ParallelFor parallel = [threads](int64_t n, int64_t, const sce::RangeFn& work) {
      RunOnThreads(n, threads, work);
    };
    sce::SparseDenseMatmul(c.view, table, c.dim, sce::Quantization(), t.lookup_out[dtype].data(),
                           parallel);
    return;
  }
  const bool uniform = m == kGroupedSumUniform || m == kRowLinesUniform;
  const std::vector<Block>& blocks = uniform ? t.uniform_blocks : t.blocks;
  const bool sum = m == kGroupedSum || m == kGroupedSumUniform;
  std::vector<uint32_t> sinks(blocks.size(), 0);
  RunOnThreads(static_cast<int64_t>(blocks.size()), threads, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (sum) {
        GroupedSum<Row>(blocks[b], table, c.dim,
                        (uniform ? t.uniform_out : t.sum_out)[dtype].data());
      } else {
        sinks[b] = RowLines<Row>(blocks[b], table, c.dim);
      }
    }
  });
  for (uint32_t s : sinks) g_sink = g_sink ^ s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <csr file> <rounds> <threads>\n", argv[0]);
    return 2;
  }
  const std::vector<Csr> csrs = sce_bench::ReadCsrs(argv[1]);
  const int rounds = std::atoi(argv[2]), threads = std::atoi(argv[3]);
  if (rounds < 1 || threads < 1) {
    std::fprintf(stderr, "rounds and threads must be positive\n");
    return 2;
  }
  std::mt19937_64 rng(7);
  std::vector<std::unique_ptr<Table>> tables;
  int64_t entries = 0, rows = 0;
  for (const Csr& c : csrs) {
    if (const sce::Status status = sce::ValidateCsrView(c.view); !status.ok()) {
      std::fprintf(stderr, "bad CSR: %s\n", status.message().c_str());
      return 2;
    }
    if (!sce::SampleMajorOrder::Fits(c.view)) {
      std::fprintf(stderr, "table beyond the 32-bit row index\n");
      return 2;
    }
    tables.push_back(std::make_unique<Table>(c, &rng));
    for (const Block& b : tables.back()->blocks) entries += b.sample_begin.back();
    rows += c.view.table_rows;
  }
  std::vector<double> ms[kMeasures][2];
  int narrow_faster[kMeasures] = {};
  constexpr int kWarmUp = 3;
  for (int r = 0; r < rounds + kWarmUp; ++r) {
    for (int m = 0; m < kMeasures; ++m) {
      double t[2];
      for (int i = 0; i < 2; ++i) {
        const int dtype = (r % 2 == 0) ? i : 1 - i;  // 0 float32, 1 bfloat16
        const auto start = std::chrono::steady_clock::now();
        for (auto& table : tables) {
          if (dtype == 0) {
            RunOnce<float>(static_cast<Measure>(m), *table, threads, 0);
          } else {
            RunOnce<sce::Bfloat16>(static_cast<Measure>(m), *table, threads, 1);
          }
        }
        t[dtype] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                             start).count();
      }
      if (r < kWarmUp) continue;
      ms[m][0].push_back(t[0]);
      ms[m][1].push_back(t[1]);
      narrow_faster[m] += t[1] < t[0];
    }
    for (auto& table : tables) {  // the grouped sum is the lookup without its grouping
      for (int k = 0; k < 2; ++k) {
        if (std::memcmp(table->lookup_out[k].data(), table->sum_out[k].data(),
                        table->lookup_out[k].size() * sizeof(float)) != 0) {
          std::fprintf(stderr, "the grouped sum's activations differ from the lookup's\n");
          return 1;
        }
      }
    }
  }
  std::printf("%zu stacked tables, %lld valid entries, %lld rows, %d thread(s), %d rounds "
              "(medians; ratio float32 / bfloat16 time, above 1: bfloat16 faster)\n",
              csrs.size(), static_cast<long long>(entries), static_cast<long long>(rows), threads,
              rounds);
  for (int m = 0; m < kMeasures; ++m) {
    const double wide = Median(ms[m][0]), narrow = Median(ms[m][1]);
    std::printf("  %-26s float32 %7.3f ms  bfloat16 %7.3f ms  ratio %.3f  (bfloat16 faster in "
                "%d of %d)\n",
                kMeasureNames[m], wide, narrow, wide / narrow, narrow_faster[m], rounds);
  }
  return 0;
}
