// RMSNorm over the last dimension and its backward (CUDA: rmsnorm.cu, where
// the forward is fused with the residual add: residual_rmsnorm_forward).
// Row reductions accumulate in double (O(N*C), cheap) for float accuracy, in
// fixed lanes (row_reduce.h) so they vectorise.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// rstd[n] = 1/sqrt(mean(inp[n]^2) + eps), out[n, c] = inp[n, c] * rstd[n] * w[c].
// rstd may be null.
template <class T> void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + (size_t)n * C;
    T* o = out + (size_t)n * C;
    const double ss = detail::row_dot_wide<double>(x, x, (size_t)C);
    const T r = (T)(1.0 / std::sqrt(ss / C + eps));
    if (rstd) rstd[n] = r;
    for (int c = 0; c < C; ++c) o[c] = (x[c] * r) * w[c];
  }
}

// y_c = x_c r w_c with r = (mean(x^2) + eps)^(-1/2), so dr/dx_j = -r^3 x_j / C:
//   dx_j = r w_j g_j - (r^3 / C) x_j sum_c g_c w_c x_c ;  dw_c = sum_n g_nc x_nc r_n.
// dinp is parallel over rows; dw over column ranges (rows summed in order).
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C) {
  static_assert(detail::kSupported<T>);
  if (dinp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const T* x = inp + (size_t)n * C;
      const T* g = dout + (size_t)n * C;
      T* dx = dinp + (size_t)n * C;
      double part[detail::kLanes] = {};
      int c = 0;
      for (; c + detail::kLanes <= C; c += detail::kLanes)
        for (int j = 0; j < detail::kLanes; ++j) part[j] += (double)g[c + j] * (double)w[c + j] * (double)x[c + j];
      double dot = 0.0;
      for (int j = 0; j < detail::kLanes; ++j) dot += part[j];
      for (; c < C; ++c) dot += (double)g[c] * (double)w[c] * (double)x[c];
      const T r = rstd[n];
      const T k = (T)((double)r * r * r * dot / C);
      for (int c = 0; c < C; ++c) dx[c] += r * w[c] * g[c] - k * x[c];
    }
  }
  if (dw) {
    constexpr int kCols = 64;
    const int nchunks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < nchunks; ++ch) {
      const int c0 = ch * kCols, c1 = std::min(C, c0 + kCols);
      T acc[kCols] = {};
      for (int n = 0; n < N; ++n) {
        const T* x = inp + (size_t)n * C;
        const T* g = dout + (size_t)n * C;
        const T r = rstd[n];
        for (int c = c0; c < c1; ++c) acc[c - c0] += g[c] * x[c] * r;
      }
      for (int c = c0; c < c1; ++c) dw[c] += acc[c - c0];
    }
  }
}

}  // namespace kvs::cpu
