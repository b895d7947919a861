// Large host buffers on transparent huge pages. The CPU engine's activations,
// parameters, gradients and moments are a few buffers of megabytes each that
// every step streams through; on 4 KiB pages the GEMMs' packing and the
// elementwise passes miss the TLB on every page. Buffers of 2 MiB or more are
// their own mapping (never reused heap pages), aligned to 2 MiB and marked
// MADV_HUGEPAGE (Linux's default THP mode,
// "madvise", backs only marked memory with huge pages); the kernel may still
// decline, and a system with THP off ("never") gets ordinary pages. Measured
// in docs/PERFORMANCE.md ("Huge pages").
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace kvs {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// bytes >= kHugePageBytes: 2 MiB-aligned memory, advised for huge pages;
// smaller: ordinary operator new. Throws std::bad_alloc like new.
void* huge_page_alloc(size_t bytes);
void huge_page_free(void* p, size_t bytes) noexcept;

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(huge_page_alloc(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { huge_page_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

// A host buffer that is on huge pages once it is large.
template <class T>
using HostVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace kvs
