// Backing large embedding tables with transparent huge pages (docs/lookup.md#huge-pages).
//
// The lookup and the fused update touch a few table rows per id, each in a different 4 KiB page
// of a multi-gigabyte buffer, so with ordinary pages nearly every row costs a TLB miss and a page
// walk that itself misses the caches. With 2 MiB pages the page table of a 2.4 GB table has 1,200
// entries and fits the CPU's second-level TLB. TensorFlow allocates variable buffers with malloc,
// and most Linux hosts enable transparent huge pages only for memory that asks for them
// ("madvise" mode), so the kernels ask: once per large buffer they mark its 2 MiB-aligned
// interior MADV_HUGEPAGE and collapse the pages already there (MADV_COLLAPSE, Linux >= 6.1).
//
// Best effort by design: the contents never change, any refusal is ignored (older kernels,
// "never" mode, no free huge pages), and nothing happens off Linux. Setting the environment
// variable TF_SC_EMBEDDING_HUGE_PAGES=0 turns it off for the process.
#ifndef SCE_CORE_HUGE_PAGES_H_
#define SCE_CORE_HUGE_PAGES_H_

#include <cstdint>

namespace sce {

// Buffers smaller than this stay on ordinary pages: their rows are few enough for the TLB.
constexpr int64_t kHugePageMinBytes = int64_t{8} << 20;

// A buffer already advised is advised again after this many further calls, in case its address
// now belongs to a new allocation of the same size (collapsing pages that are already huge costs
// tens of microseconds per gigabyte).
constexpr int64_t kHugePageRecheckCalls = 1024;

// What one call did.
enum class HugePageAdvice {
  kAdvised,       // the interior was marked and collapsed now
  kAlreadyDone,   // advised recently (see kHugePageRecheckCalls)
  kTooSmall,      // below kHugePageMinBytes, or no whole 2 MiB page inside
  kDisabled,      // TF_SC_EMBEDDING_HUGE_PAGES=0
  kUnsupported,   // not Linux, or the kernel refused MADV_HUGEPAGE
};

// Asks for huge pages behind [data, data + bytes), a buffer the caller keeps alive for the
// duration of the call. Thread-safe; cheap after the first call for a buffer (a hash lookup).
HugePageAdvice BackWithHugePages(const void* data, int64_t bytes);

}  // namespace sce

#endif  // SCE_CORE_HUGE_PAGES_H_
