// Which vector instruction set a hand-tuned loop runs with (docs/lookup.md#forward-lookup,
// docs/optimizers.md#how-the-kernel-visits-the-rows).
// The library is built for the baseline x86-64 ISA (no -march), as TensorFlow's wheel is, so its
// per-id and per-row loops carry versions for wider vector units and pick one at run time from
// what the CPU reports. The loops that pick explicitly (row loops, intrinsics loops) ask here;
// small branch-free passes use GCC's target_clones, whose loader-time resolver asks the CPU
// itself.
#ifndef SCE_CORE_VECTOR_ISA_H_
#define SCE_CORE_VECTOR_ISA_H_

#include <cstdint>

namespace sce {

// The instruction sets the row loops (fused update, forward lookup, gathered segment sums) are
// compiled for: AVX-512 (F, VL, BW, DQ), AVX2 with FMA (AMD Zen 1-3, Intel Haswell to Alder
// Lake), and the baseline; in order, so a wider set compares greater.
enum class VectorIsa { kBaseline, kAvx2, kAvx512 };

// The function attributes that compile a row loop for the first two (what BestVectorIsa checks).
#define SCE_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#define SCE_TARGET_AVX2 __attribute__((target("avx2,fma")))

// The widest of those the CPU runs; checked once.
VectorIsa BestVectorIsa();

// `requested` if the CPU runs it, else the widest set it runs (a value outside the enum counts as
// the baseline): what a row loop given an instruction set by its caller (a test comparing the
// versions) runs, so that no caller can make it execute instructions the CPU lacks.
VectorIsa UsableIsa(VectorIsa requested);

// Whether the CPU runs AVX-512 F, all that the hand-written intrinsics loops of avx512.h use;
// checked once.
bool CpuHasAvx512F();

// The row loops (forward lookup, fused update, gathered segment sums) have builds with the row
// width fixed at compile time for these common widths (whole vectors, no remainder loop; the
// width is a template parameter kDim), and one for any width (kDim = 0).
constexpr int64_t kFixedRowWidths[3] = {16, 32, 64};

// The index of `dim`'s build: i where kFixedRowWidths[i] == dim, else 3 (the any-width build).
constexpr int RowWidthBuild(int64_t dim) {
  for (int i = 0; i < 3; ++i) {
    if (kFixedRowWidths[i] == dim) return i;
  }
  return 3;
}

// The build of a row loop for `isa` (as UsableIsa gives it) and `dim`, from its table of builds:
// rows VectorIsa kBaseline, kAvx2, kAvx512; columns RowWidthBuild's order.
template <typename Fn>
Fn SelectRowLoopBuild(const Fn (&builds)[3][4], VectorIsa isa, int64_t dim) {
  return builds[static_cast<int>(UsableIsa(isa))][RowWidthBuild(dim)];
}

// The builds of a row loop template `fn<kDim>` in RowWidthBuild's order.
#define SCE_ROW_WIDTH_BUILDS(fn)                                                         \
  {                                                                                      \
    &fn<::sce::kFixedRowWidths[0]>, &fn<::sce::kFixedRowWidths[1]>,                      \
        &fn<::sce::kFixedRowWidths[2]>, &fn<0>                                           \
  }

}  // namespace sce

#endif  // SCE_CORE_VECTOR_ISA_H_
