// Which vector instruction set a hand-tuned loop runs with (docs/lookup.md#forward-lookup,
// docs/optimizers.md#how-the-kernel-visits-the-rows).
// The library is built for the baseline x86-64 ISA (no -march), as TensorFlow's wheel is, so its
// per-id and per-row loops carry versions for wider vector units and pick one at run time from
// what the CPU reports. This is the one place that asks the CPU.
#ifndef SCE_CORE_VECTOR_ISA_H_
#define SCE_CORE_VECTOR_ISA_H_

#include <cstdint>

namespace sce {

// The instruction sets the row loops (fused update, forward lookup) are compiled for: AVX-512
// (F, VL, BW, DQ), AVX2 with FMA (AMD Zen 1-3, Intel Haswell to Alder Lake), and the baseline.
enum class VectorIsa { kBaseline, kAvx2, kAvx512 };

// The widest of those the CPU runs; checked once.
VectorIsa BestVectorIsa();

// Whether the CPU runs AVX-512 F, all that the hand-written intrinsics loops of avx512.h use;
// checked once.
bool CpuHasAvx512F();

// The row loops (forward lookup, fused update, gathered segment sums) have builds with the row
// width fixed at compile time for the common widths 16, 32 and 64 (whole vectors, no remainder
// loop; the width a template parameter kDim), and one for any width (kDim = 0). The index of
// `dim`'s build among {16, 32, 64, any}:
constexpr int RowWidthBuild(int64_t dim) {
  return dim == 16 ? 0 : dim == 32 ? 1 : dim == 64 ? 2 : 3;
}

// The builds of a row loop template `fn<kDim>` in RowWidthBuild's order.
#define SCE_ROW_WIDTH_BUILDS(fn) \
  { &fn<16>, &fn<32>, &fn<64>, &fn<0> }

}  // namespace sce

#endif  // SCE_CORE_VECTOR_ISA_H_
