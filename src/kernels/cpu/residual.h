// Residual add (CUDA: fused into residual_rmsnorm_forward in rmsnorm.cu; where a norm
// follows, the CPU block uses the fused one too, kernels/cpu/rmsnorm.h).
#pragma once
#include <cstddef>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// out = a + b (out may alias a).
template <class T> void residual_forward(T* out, const T* a, const T* b, size_t n) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace kvs::cpu
