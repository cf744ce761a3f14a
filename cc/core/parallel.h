// How the algorithms ask for parallelism without depending on a thread pool: the caller passes a
// function that runs `work(begin, end)` over disjoint ranges covering [0, n). TF kernels pass the
// intra-op thread pool; tests and the pybind helpers run serially.
#ifndef SCE_CORE_PARALLEL_H_
#define SCE_CORE_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace sce {

using RangeFn = std::function<void(int64_t begin, int64_t end)>;
// cost_per_unit is a rough number of cycles per unit of work, used to choose the block size.
using ParallelFor = std::function<void(int64_t n, int64_t cost_per_unit, const RangeFn& work)>;

inline void RunSerially(int64_t n, int64_t /*cost_per_unit*/, const RangeFn& work) {
  if (n > 0) work(0, n);
}

}  // namespace sce

#endif  // SCE_CORE_PARALLEL_H_
