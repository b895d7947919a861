// SwiGLU activation of the MLP (CUDA: swiglu.cu, reading gate and up from the
// fused gate/up projection).
#pragma once
#include <cstddef>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// out = silu(gate) * up, elementwise over n.
template <class T> void swiglu_forward(T* out, const T* gate, const T* up, size_t n) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T sig = T(1) / (T(1) + detail::exp_fast(-g));
    out[i] = g * sig * up[i];
  }
}

// d silu(g)/dg = sig (1 + g (1 - sig))
template <class T> void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n) {
  static_assert(detail::kSupported<T>);
  if (!dgate && !dup) return;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T sig = T(1) / (T(1) + detail::exp_fast(-g));
    if (dgate) dgate[i] += dout[i] * up[i] * sig * (T(1) + g * (T(1) - sig));
    if (dup) dup[i] += dout[i] * g * sig;
  }
}

}  // namespace kvs::cpu
