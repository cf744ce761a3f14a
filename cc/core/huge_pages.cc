#include "cc/core/huge_pages.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sce {
namespace {

constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;
#if defined(__linux__) && !defined(MADV_COLLAPSE)
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack the name
#endif

// The registry never grows without bound: past this many buffers it starts over (every buffer
// is then advised once more, which is harmless).
constexpr size_t kMaxRegisteredBuffers = 4096;

bool Enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TF_SC_EMBEDDING_HUGE_PAGES");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

struct Registered {
  int64_t bytes = 0;
  int64_t calls_since_advice = 0;
};

}  // namespace

HugePageAdvice BackWithHugePages(const void* data, int64_t bytes) {
  if (!Enabled()) return HugePageAdvice::kDisabled;
  if (data == nullptr || bytes < kHugePageMinBytes) return HugePageAdvice::kTooSmall;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t end = (start + static_cast<uintptr_t>(bytes)) & ~(kHugePageBytes - 1);
  if (begin >= end) return HugePageAdvice::kTooSmall;

  static std::mutex mu;
  static std::unordered_map<uintptr_t, Registered>* registry =
      new std::unordered_map<uintptr_t, Registered>();
  // Held while advising, so that two kernels never collapse the same buffer at once.
  std::lock_guard<std::mutex> lock(mu);
  auto found = registry->find(start);
  if (found != registry->end() && found->second.bytes == bytes &&
      ++found->second.calls_since_advice < kHugePageRecheckCalls) {
    return HugePageAdvice::kAlreadyDone;
  }
  if (registry->size() >= kMaxRegisteredBuffers) registry->clear();
  (*registry)[start] = Registered{bytes, 0};
#if defined(__linux__)
  void* interior = reinterpret_cast<void*>(begin);
  const size_t length = end - begin;
  if (madvise(interior, length, MADV_HUGEPAGE) != 0) return HugePageAdvice::kUnsupported;
  // Pages faulted in before the advice (the table's initial values) stay small until collapsed;
  // a refusal (EINVAL before Linux 6.1, EAGAIN / ENOMEM under memory pressure) leaves them so.
  (void)madvise(interior, length, MADV_COLLAPSE);
  return HugePageAdvice::kAdvised;
#else
  return HugePageAdvice::kUnsupported;
#endif
}

}  // namespace sce
