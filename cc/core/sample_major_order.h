// The valid entries of one source SparseCore's CSR segments, grouped by sample
// (docs/lookup.md#sample-major-order). The CSR sorts a segment's entries by table row, so a loop
// in buffer order adds every entry into an activation row somewhere in memory: a random
// read-modify-write of a float32 row per entry, besides the table row it reads. Grouped by
// sample, the forward lookup sums each activation row in registers and stores it once, so the
// only random accesses left are the table rows; their bytes then decide the time, which is what
// makes 16-bit rows pay. Within a sample the entries keep the order the segment loop visits them
// (minibatch, shard, buffer position), so the sums are the same bits.
#ifndef SCE_CORE_SAMPLE_MAJOR_ORDER_H_
#define SCE_CORE_SAMPLE_MAJOR_ORDER_H_

#include <cstdint>
#include <vector>

#include "cc/core/constants.h"
#include "cc/core/csr_view.h"

namespace sce {

// Entries grouped by sample: sample i's entries are [sample_begin[i], sample_begin[i + 1]) of
// `rows` (rows of the table given to the lookup, shard offset included) and `gains`. int32 offsets
// hold any count: a lookup's entries lie in buffers that int32 row pointers index. (Offsets of
// int64 made the float32 lookup of the benchmark workload 5% slower.)
struct SampleMajorEntries {
  const int32_t* sample_begin;
  const uint32_t* rows;
  const float* gains;
};

// Calls visit(sample, table row, gain) for every valid entry of source SparseCore `sc` of `view`
// (which must have passed ValidateCsrView), in the order the lookup's buffer-order loop adds them:
// the one home of that order for every grouping.
template <typename Visit>
void ForEachValidEntry(const CsrView& view, int64_t sc, Visit&& visit) {
  const int64_t rows_per_shard = view.rows_per_shard();
  for (int64_t b = 0; b < view.num_minibatches; ++b) {
    for (int64_t p = 0; p < view.local_shards(); ++p) {
      int64_t begin, end;
      view.Segment(sc, b, view.first_local_shard + p, &begin, &end);
      const int64_t shard_origin = p * rows_per_shard;
      for (int64_t i = begin; i < end; ++i) {
        const int32_t token = view.token_ids[i], sample = view.sample_ids[i];
        if (token == kPad || sample == kPad) continue;
        visit(sample, shard_origin + token, view.gains[i]);
      }
    }
  }
}

class SampleMajorOrder {
 public:
  // Whether every row of `view`'s table fits the entries' 32-bit row index. Tables beyond that
  // (2^32 rows on one host) take the lookup's loop in buffer order.
  static bool Fits(const CsrView& view);

  // This thread's order, for every lookup the thread runs whatever its row type. Its buffers keep
  // their memory for the next Build, so a thread allocates only when a batch's block is larger
  // than any before; the memory (8 bytes per entry and 4 per sample of the largest block) lives
  // as long as the thread.
  static SampleMajorOrder& ForThisThread();

  // Groups the valid entries of source SparseCore `sc` by sample. `view` must have passed
  // ValidateCsrView and Fits. False, with the order unusable, when the buffers could not grow
  // (out of memory): the caller then sums in buffer order, which allocates nothing.
  bool Build(const CsrView& view, int64_t sc);

  // The grouping of the last Build, for i below the view's samples per SparseCore.
  SampleMajorEntries entries() const { return {sample_begin_.data(), rows_.data(), gains_.data()}; }

 private:
  std::vector<int32_t> sample_begin_;
  std::vector<uint32_t> rows_;
  std::vector<float> gains_;
};

}  // namespace sce

#endif  // SCE_CORE_SAMPLE_MAJOR_ORDER_H_
