// SwiGLU activation of the MLP (CUDA: swiglu.cu, reading gate and up from the
// fused gate/up projection).
#pragma once
#include <cstddef>
#include <type_traits>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

namespace detail::swiglu {

// f(i, width) for the elements i, i + width, ... of [0, n): floats eight at a
// time (f32x8: the loop over the scalar exp_fast is not vectorised by GCC 12,
// see exp_fast.h), then the last n % 8 one by one; doubles one by one.
template <class T, class F> void for_each_lane_group(size_t n, F f) {
  if constexpr (std::is_same_v<T, float>) {
    const size_t groups = n / 8;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < groups; ++c) f.template operator()<f32x8>(c * 8);
    for (size_t i = groups * 8; i < n; ++i) f.template operator()<float>(i);
  } else {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) f.template operator()<T>(i);
  }
}

template <class V, class T> V get(const T* p, size_t i) {
  if constexpr (std::is_same_v<V, f32x8>) return load8(p + i);
  else return p[i];
}
template <class V, class T> void put(T* p, size_t i, V v) {
  if constexpr (std::is_same_v<V, f32x8>) store8(p + i, v);
  else p[i] = v;
}

}  // namespace detail::swiglu

// out = silu(gate) * up, elementwise over n.
template <class T> void swiglu_forward(T* out, const T* gate, const T* up, size_t n) {
  static_assert(detail::kSupported<T>);
  using namespace detail::swiglu;
  for_each_lane_group<T>(n, [=]<class V>(size_t i) {
    const V g = get<V>(gate, i);
    const V sig = T(1) / (T(1) + detail::exp_fast(-g));
    put<V>(out, i, g * sig * get<V>(up, i));
  });
}

// d silu(g)/dg = sig (1 + g (1 - sig)). With overwrite, dgate and dup are
// written instead of added into (the caller need not zero them first).
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n, bool overwrite = false) {
  static_assert(detail::kSupported<T>);
  if (!dgate && !dup) return;
  using namespace detail::swiglu;
  for_each_lane_group<T>(n, [=]<class V>(size_t i) {
    const V g = get<V>(gate, i);
    const V sig = T(1) / (T(1) + detail::exp_fast(-g));
    const V d = get<V>(dout, i);
    const V dg = d * get<V>(up, i) * sig * (T(1) + g * (T(1) - sig)), du = d * g * sig;
    if (dgate) put<V>(dgate, i, overwrite ? dg : get<V>(dgate, i) + dg);
    if (dup) put<V>(dup, i, overwrite ? du : get<V>(dup, i) + du);
  });
}

}  // namespace kvs::cpu
