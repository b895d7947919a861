// Zeroing a buffer before ops add into it (every backward op accumulates,
// ops.h). Large buffers are cleared by every thread: one core's memset
// reaches about two thirds of what two do.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

template <class T> void zero_fill(T* p, size_t n) {
  static_assert(detail::kSupported<T>);
  constexpr size_t kChunk = size_t{1} << 16;  // elements per piece
  if (n < 2 * kChunk) {
    std::memset(p, 0, n * sizeof(T));
    return;
  }
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < chunks; ++i) {
    const size_t b = static_cast<size_t>(i) * kChunk, e = std::min(n, b + kChunk);
    std::memset(p + b, 0, (e - b) * sizeof(T));
  }
}

}  // namespace kvs::cpu
