// The "sigmoid_gate" parametrisation of the KV shift (paper section 4.6,
// window 1), as CUDA's shift_gate.cu: the stored tensor is [H, 2] with the
// gate logit g in column 1 (column 0 unused); the shift op reads the effective
// coefficients eff[h] = [1 - sigmoid(g), sigmoid(g)].
#pragma once
#include <cmath>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// eff[h, 0] = 1 - sigmoid(stored[h, 1]) ; eff[h, 1] = sigmoid(stored[h, 1]).
template <class T> void shift_gate_forward(T* eff, const T* stored, int H) {
  static_assert(detail::kSupported<T>);
  for (int h = 0; h < H; ++h) {
    const T s = T(1) / (T(1) + std::exp(-stored[h * 2 + 1]));
    eff[h * 2 + 0] = T(1) - s;
    eff[h * 2 + 1] = s;
  }
}

// Chains d(effective coefficients) into the stored tensor's gradient:
// dstored[h, 1] += sigmoid'(g) * (deff[h, 1] - deff[h, 0]); column 0 gets nothing.
template <class T> void shift_gate_backward(T* dstored, const T* deff, const T* stored, int H) {
  static_assert(detail::kSupported<T>);
  for (int h = 0; h < H; ++h) {
    const T s = T(1) / (T(1) + std::exp(-stored[h * 2 + 1]));
    dstored[h * 2 + 1] += s * (T(1) - s) * (deff[h * 2 + 1] - deff[h * 2 + 0]);
  }
}

}  // namespace kvs::cpu
