#include "cc/core/vector_isa.h"

namespace sce {

VectorIsa BestVectorIsa() {
#if defined(__x86_64__)
  static const VectorIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
      return VectorIsa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::kAvx2;
    return VectorIsa::kBaseline;
  }();
  return best;
#else
  return VectorIsa::kBaseline;
#endif
}

VectorIsa UsableIsa(VectorIsa requested) {
  const VectorIsa best = BestVectorIsa();
  if (requested != VectorIsa::kBaseline && requested != VectorIsa::kAvx2 &&
      requested != VectorIsa::kAvx512) {
    return VectorIsa::kBaseline;
  }
  return requested < best ? requested : best;
}

bool CpuHasAvx512F() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace sce
