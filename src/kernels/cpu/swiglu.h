// SwiGLU activation of the MLP on the fused gate/up projection
// gate_up [N, 2F] (gate columns [0, F), up columns [F, 2F)), as the CUDA
// kernels (swiglu.cu) read it: one [2F, C] GEMM makes both halves.
#pragma once
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

namespace detail::swiglu {

// f(row, j) for the columns j of [0, F) of each of N rows: floats sixteen at
// a time where the build has AVX-512 (f32x16), then eight (f32x8: the loop
// over the scalar exp_fast is not vectorised by GCC 12, see exp_fast.h), then
// the row's last F % 8 one by one; doubles one by one. Every lane does the
// scalar's operations, so the width never changes a bit. Sixteen lanes where
// the registers hold them: lm-small's SwiGLU (1024 x 688, one thread, Zen 5)
// forward 0.37 -> 0.28 ms, backward 0.46 -> 0.34. Rows are split between the
// threads.
template <class T, class Fn> void for_each_lane_group(size_t N, size_t F, Fn f) {
  const long rows = static_cast<long>(N);
#pragma omp parallel for schedule(static)
  for (long r = 0; r < rows; ++r) {
    size_t j = 0;
    if constexpr (std::is_same_v<T, float>) {
      if constexpr (kRegBytes == 64)
        for (; j + 16 <= F; j += 16) f.template operator()<f32x16>(static_cast<size_t>(r), j);
      for (; j + 8 <= F; j += 8) f.template operator()<f32x8>(static_cast<size_t>(r), j);
    }
    for (; j < F; ++j) f.template operator()<T>(static_cast<size_t>(r), j);
  }
}

// Each row's gate and up halves are runs of F values, too short for the
// hardware prefetcher to get ahead of, so SwiGLU asks for the next row's
// lines (the same columns) while it works on this row's, once per 16 floats
// (a 64-byte line). It is memory bound: see docs/PERFORMANCE.md for what
// this gained.
template <class V> bool prefetches(size_t r, size_t N, size_t j) {
  return !std::is_arithmetic_v<V> && j % 16 == 0 && r + 1 < N;
}
inline void prefetch_read(const void* p) { __builtin_prefetch(p, 0); }
inline void prefetch_write(void* p) { __builtin_prefetch(p, 1); }

template <class V, class T> V get(const T* p, size_t i) {
  if constexpr (std::is_arithmetic_v<V>) {
    return p[i];
  } else {
    V v;
    std::memcpy(&v, p + i, sizeof v);
    return v;
  }
}
template <class V, class T> void put(T* p, size_t i, V v) {
  if constexpr (std::is_arithmetic_v<V>) p[i] = v;
  else std::memcpy(p + i, &v, sizeof v);
}

}  // namespace detail::swiglu

// out [N, F] = silu(gate) * up.
template <class T> void swiglu_forward(T* out, const T* gate_up, size_t N, size_t F) {
  static_assert(detail::kSupported<T>);
  using namespace detail::swiglu;
  for_each_lane_group<T>(N, F, [=]<class V>(size_t r, size_t j) {
    const T* gu = gate_up + r * 2 * F;
    if (prefetches<V>(r, N, j)) {  // the next row's lines
      prefetch_read(gu + 2 * F + j);
      prefetch_read(gu + 3 * F + j);
      prefetch_write(out + (r + 1) * F + j);
    }
    const V g = get<V>(gu, j);
    const V sig = T(1) / (T(1) + detail::exp_fast(-g));
    put<V>(out, r * F + j, g * sig * get<V>(gu, F + j));
  });
}

// dgate_up [N, 2F] from dout [N, F]: d silu(g)/dg = sig (1 + g (1 - sig)).
// With overwrite, dgate_up is written instead of added into (the caller need
// not zero it first).
template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, size_t N, size_t F, bool overwrite = false) {
  static_assert(detail::kSupported<T>);
  using namespace detail::swiglu;
  for_each_lane_group<T>(N, F, [=]<class V>(size_t r, size_t j) {
    const T* gu = gate_up + r * 2 * F;
    T* dgu = dgate_up + r * 2 * F;
    if (prefetches<V>(r, N, j)) {  // the next row's lines
      prefetch_read(gu + 2 * F + j);
      prefetch_read(gu + 3 * F + j);
      prefetch_read(dout + (r + 1) * F + j);
      prefetch_write(dgu + 2 * F + j);
      prefetch_write(dgu + 3 * F + j);
    }
    const V g = get<V>(gu, j);
    const V sig = T(1) / (T(1) + detail::exp_fast(-g));
    const V d = get<V>(dout, r * F + j);
    const V dg = d * get<V>(gu, F + j) * sig * (T(1) + g * (T(1) - sig)), du = d * g * sig;
    put<V>(dgu, j, overwrite ? dg : get<V>(dgu, j) + dg);
    put<V>(dgu, F + j, overwrite ? du : get<V>(dgu, F + j) + du);
  });
}

}  // namespace kvs::cpu
