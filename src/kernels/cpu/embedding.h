// Token embedding lookup and its backward (CUDA: embedding.cu).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// out[n, :] = wte[tokens[n], :]
// Vocabulary-parallel form: wte holds rows [v_begin, v_begin + v_count) only,
// and rows of tokens outside them are 0 (the TP group sums the ranks' outputs).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, int v_begin = 0,
                       int v_count = INT32_MAX) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* dst = out + (size_t)n * C;
    const int64_t row = (int64_t)tokens[n] - v_begin;
    if (row < 0 || row >= v_count) {
      for (int c = 0; c < C; ++c) dst[c] = T(0);
      continue;
    }
    const T* src = wte + (size_t)row * C;
    for (int c = 0; c < C; ++c) dst[c] = src[c];
  }
}

// dwte[tokens[n], :] += dout[n, :]
// (vocabulary-parallel: only tokens in [v_begin, v_begin + v_count), into dwte's local rows)
// Several rows may share a token, so rows cannot be split across threads.
// Threads own disjoint column ranges instead and walk the rows in order.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C, int v_begin = 0,
                        int v_count = INT32_MAX) {
  static_assert(detail::kSupported<T>);
  if (!dwte) return;
  constexpr int kCols = 64;
  const int nchunks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < nchunks; ++ch) {
    const int c0 = ch * kCols, c1 = std::min(C, c0 + kCols);
    for (int n = 0; n < N; ++n) {
      const int64_t row = (int64_t)tokens[n] - v_begin;
      if (row < 0 || row >= v_count) continue;
      T* dst = dwte + (size_t)row * C;
      const T* src = dout + (size_t)n * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace kvs::cpu
