// RMSNorm over the last dimension, fused with the residual add before it
// (residual_rmsnorm_forward), and its backward (CUDA: rmsnorm.cu).
// Row reductions accumulate in double (O(N*C), cheap) for float accuracy, in
// fixed lanes (row_reduce.h) so they vectorise.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/row_reduce.h"
#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// Fused residual add + RMSNorm, as rmsnorm.cu (the add is skipped when b is null):
//   resid_out = a + b  (written when b is non-null; may alias a or b)
//   out = resid_out * rstd * w,  rstd[n] = 1/sqrt(mean(resid_out[n]^2) + eps)  (rstd may be null)
// Row by row, so the norm reads the sum while it is in L1: the same bits as
// the add and the norm as two passes, one read of the residual stream fewer.
template <class T>
void residual_rmsnorm_forward(T* resid_out, T* out, T* rstd, const T* a, const T* b, const T* w, int N, int C,
                              double eps) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t row = (size_t)n * C;
    const T* x = a + row;
    if (b) {
      T* r = resid_out + row;
      for (int c = 0; c < C; ++c) r[c] = x[c] + b[row + c];
      x = r;
    }
    T* o = out + row;
    const double ss = detail::row_dot_wide<double>(x, x, (size_t)C);
    const T r = (T)(1.0 / std::sqrt(ss / C + eps));
    if (rstd) rstd[n] = r;
    for (int c = 0; c < C; ++c) o[c] = (x[c] * r) * w[c];
  }
}

// rstd[n] = 1/sqrt(mean(inp[n]^2) + eps), out[n, c] = inp[n, c] * rstd[n] * w[c].
// rstd may be null.
template <class T> void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps) {
  residual_rmsnorm_forward<T>(nullptr, out, rstd, inp, nullptr, w, N, C, eps);
}

// y_c = x_c r w_c with r = (mean(x^2) + eps)^(-1/2), so dr/dx_j = -r^3 x_j / C:
//   dx_j = r w_j g_j - (r^3 / C) x_j sum_c g_c w_c x_c ;  dw_c = sum_n g_nc x_nc r_n.
// One pass over the rows (as rmsnorm.cu): blocks of kRmsNormRowBlock rows, in
// parallel; each block adds its rows' dx and, in order, its own dw partial
// [C]; then dw += the partials, block by block in order. The block size is
// fixed, so the sums do not depend on the thread count. (A second pass over
// dout and inp for dw, parallel over columns, took 0.64x the time of the dx
// pass on lm-small: docs/PERFORMANCE.md.)
namespace detail {
constexpr int kRmsNormRowBlock = 32;
}

template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C) {
  static_assert(detail::kSupported<T>);
  constexpr int kRows = detail::kRmsNormRowBlock;
  const int nblocks = (N + kRows - 1) / kRows;
  static thread_local std::vector<T> partials;  // [nblocks, C], reused across calls
  if (dw) partials.resize(std::max(partials.size(), (size_t)nblocks * C));
  T* const part_dw = dw ? partials.data() : nullptr;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    T* pw = part_dw ? part_dw + (size_t)blk * C : nullptr;
    if (pw) std::fill(pw, pw + C, T(0));
    for (int n = blk * kRows; n < std::min(N, (blk + 1) * kRows); ++n) {
      const T* x = inp + (size_t)n * C;
      const T* g = dout + (size_t)n * C;
      const T r = rstd[n];
      if (dinp) {
        using V = detail::Lanes<double>;
        V part{};
        int c = 0;
        for (; c + detail::kLanes <= C; c += detail::kLanes)
          part += detail::load_lanes_as<double>(g + c) * detail::load_lanes_as<double>(w + c) *
                  detail::load_lanes_as<double>(x + c);
        double dot = 0.0;
        for (int j = 0; j < detail::kLanes; ++j) dot += part[j];
        for (; c < C; ++c) dot += (double)g[c] * (double)w[c] * (double)x[c];
        const T k = (T)((double)r * r * r * dot / C);
        T* dx = dinp + (size_t)n * C;
        for (c = 0; c < C; ++c) dx[c] += r * w[c] * g[c] - k * x[c];
      }
      if (pw)
        for (int c = 0; c < C; ++c) pw[c] += g[c] * x[c] * r;
    }
  }
  if (dw) {
    constexpr int kCols = 64;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kCols) {
      const int nc = std::min(kCols, C - c0);
      T acc[kCols] = {};
      for (int blk = 0; blk < nblocks; ++blk) {
        const T* pw = part_dw + (size_t)blk * C + c0;
        for (int c = 0; c < nc; ++c) acc[c] += pw[c];
      }
      for (int c = 0; c < nc; ++c) dw[c0 + c] += acc[c];
    }
  }
}

}  // namespace kvs::cpu
