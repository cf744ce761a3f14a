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

#include "cc/core/csr_view.h"

namespace sce {

// One valid entry: row `row` of the table given to the lookup (shard offset included), `gain`.
struct SampleMajorEntry {
  uint32_t row;
  float gain;
};

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

  // Sample i's entries are entries()[sample_begin()[i] .. sample_begin()[i + 1]), for i below
  // the view's samples per SparseCore. int32 offsets hold any count: a SparseCore's entries lie
  // in one chunk of buffers that int32 row pointers index. (Offsets of int64 made the float32
  // lookup of the benchmark workload 5% slower.)
  const SampleMajorEntry* entries() const { return entries_.data(); }
  const int32_t* sample_begin() const { return sample_begin_.data(); }

 private:
  std::vector<int32_t> sample_begin_;
  std::vector<SampleMajorEntry> entries_;
};

}  // namespace sce

#endif  // SCE_CORE_SAMPLE_MAJOR_ORDER_H_
