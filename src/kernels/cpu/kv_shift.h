// KV shifting, generalised to a window of W past positions (CUDA: shift_rope.cu,
// fused with RoPE).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// out[b, t, h, :] = sum_{w=0..W} coef[h, w] * in[b, t - W + w, h, :], with in[b, t<0] = 0,
// summed oldest first, starting from 0.
// coef is [H, W+1], oldest position first (window 1: coef[h,0] weights t-1, coef[h,1] weights t).
// Document boundaries: with doc_start ([B, T], the first position of t's
// document within its sequence) the rows before doc_start[b, t] count as zero
// too, so the shift restarts at every document as at the sequence start.
template <class T>
void kv_shift_forward(T* out, const T* in, const T* coef, int B, int Tn, int H, int D, int W,
                      const int32_t* doc_start = nullptr) {
  static_assert(detail::kSupported<T>);
  const size_t row = (size_t)H * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      T* o = out + ((size_t)b * Tn + t) * row;
      const int lo = doc_start ? doc_start[(size_t)b * Tn + t] : 0;  // first row that is not zero history
      for (int h = 0; h < H; ++h) {
        T* oh = o + (size_t)h * D;
        for (int d = 0; d < D; ++d) oh[d] = T(0);
        for (int w = std::max(0, W - t + lo); w <= W; ++w) {
          const T c = coef[(size_t)h * (W + 1) + w];
          const T* x = in + ((size_t)b * Tn + (t - W + w)) * row + (size_t)h * D;
          for (int d = 0; d < D; ++d) oh[d] += c * x[d];
        }
      }
    }
  }
}

// din[b,s,h,:] += sum_w coef[h,w] dout[b,s+W-w,h,:]   (parallel over (b, s): own rows)
// dcoef[h,w]  += sum_{b,t,d} dout[b,t,h,d] in[b,t-W+w,h,d]  (parallel over h: own row;
//                 summed over b, t, d in order, in double)
template <class T>
void kv_shift_backward(T* din, T* dcoef, const T* dout, const T* in, const T* coef, int B, int Tn, int H, int D,
                       int W, const int32_t* doc_start = nullptr) {
  static_assert(detail::kSupported<T>);
  const size_t row = (size_t)H * D;
  if (din) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int s = 0; s < Tn; ++s) {
        T* dx = din + ((size_t)b * Tn + s) * row;
        for (int h = 0; h < H; ++h) {
          T* dxh = dx + (size_t)h * D;
          for (int w = W; w >= 0; --w) {  // t = s + W - w, increasing
            const int t = s + W - w;
            if (t >= Tn) break;
            if (doc_start && doc_start[(size_t)b * Tn + t] > s) continue;  // s is before t's document
            const T c = coef[(size_t)h * (W + 1) + w];
            const T* g = dout + ((size_t)b * Tn + t) * row + (size_t)h * D;
            for (int d = 0; d < D; ++d) dxh[d] += c * g[d];
          }
        }
      }
    }
  }
  if (dcoef) {
#pragma omp parallel for schedule(static)
    for (int h = 0; h < H; ++h) {
      constexpr int kMaxW = 64;
      for (int w0 = 0; w0 <= W; w0 += kMaxW) {  // windows are tiny; chunk for a fixed stack array
        const int w1 = std::min(W + 1, w0 + kMaxW);
        double acc[kMaxW] = {};
        for (int b = 0; b < B; ++b) {
          for (int t = 0; t < Tn; ++t) {
            const T* g = dout + ((size_t)b * Tn + t) * row + (size_t)h * D;
            const int lo = doc_start ? doc_start[(size_t)b * Tn + t] : 0;
            for (int w = std::max(w0, W - t + lo); w < w1; ++w) {
              const T* x = in + ((size_t)b * Tn + (t - W + w)) * row + (size_t)h * D;
              double s = 0.0;
              for (int d = 0; d < D; ++d) s += (double)g[d] * (double)x[d];
              acc[w - w0] += s;
            }
          }
        }
        for (int w = w0; w < w1; ++w) dcoef[(size_t)h * (W + 1) + w] += (T)acc[w - w0];
      }
    }
  }
}

}  // namespace kvs::cpu
