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
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
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

// n zeros on huge pages, for buffers a command may leave partly unwritten:
// a large one is a fresh mapping whose pages the kernel hands out as zeros
// at first touch, so what is never written (eval's and forward's gradients
// and backward scratch) takes no memory; a small one is zeroed here. A
// HostVector would write every zero itself. Its size is fixed when made.
template <class T>
class ZeroedHostBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  ZeroedHostBuffer() = default;
  explicit ZeroedHostBuffer(size_t n) : p_(static_cast<T*>(huge_page_alloc(n * sizeof(T)))), n_(n) {
    if (n * sizeof(T) < kHugePageBytes) std::memset(static_cast<void*>(p_), 0, n * sizeof(T));
  }
  ZeroedHostBuffer(ZeroedHostBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  ZeroedHostBuffer& operator=(ZeroedHostBuffer&& o) noexcept {
    ZeroedHostBuffer(std::move(o)).swap(*this);
    return *this;
  }
  ~ZeroedHostBuffer() { huge_page_free(p_, n_ * sizeof(T)); }
  void swap(ZeroedHostBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace kvs
