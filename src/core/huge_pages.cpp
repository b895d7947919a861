#include "core/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>

namespace kvs {

namespace {
size_t round_up(size_t bytes) { return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }
}  // namespace

void* huge_page_alloc(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes);
  const size_t size = round_up(bytes);
  void* p = std::aligned_alloc(kHugePageBytes, size);
  if (!p) throw std::bad_alloc();
  // A hint: where THP is off or the kernel refuses, the memory is ordinary pages.
  (void)madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void huge_page_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kHugePageBytes) ::operator delete(p);
  else std::free(p);
}

}  // namespace kvs
