#include "core/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace kvs {

namespace {
size_t round_up(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }
}  // namespace

// Large buffers are their own mapping, not heap memory: glibc may serve even
// a large aligned_alloc from heap pages an earlier buffer already touched,
// which THP does not back at the next first touch (seen in a long test
// process). A fresh mapping's pages are faulted in on first touch, where the
// kernel can give huge pages. The mapping is 2 MiB larger than needed and
// trimmed to a 2 MiB-aligned range.
void* huge_page_alloc(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes);
  const size_t size = round_up(bytes), mapped = size + kHugePageBytes;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + mapped, used_end = aligned + size;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  void* p = reinterpret_cast<void*>(aligned);
  // A hint: where THP is off or the kernel refuses, the memory is ordinary pages.
  (void)madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void huge_page_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kHugePageBytes) ::operator delete(p);
  else munmap(p, round_up(bytes));
}

}  // namespace kvs
