// Rotary position embedding in Hugging Face's rotate_half convention (CUDA:
// shift_rope.cu, fused with the KV shift).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// RoPE tables in Hugging Face's convention, computed in fp32 like HF:
// inv_freq[i] = 1 / theta^(2i/D), angle[t, i] = float(t) * inv_freq[i], i < D/2.
// cos/sin are [Tn, D/2].
// Hugging Face LlamaRotaryEmbedding in fp32:
//   inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D))   (float32 tensor ops)
//   freqs    = float(t) * inv_freq                               (float32 product)
//   cos/sin  = freqs.cos() / freqs.sin()                         (float32)
// Each fp32 operation is done as a correctly rounded float result (pow/cos/sin
// evaluated in double, then rounded to float), then stored as T.
template <class T> void rope_tables(T* cos, T* sin, int Tn, int D, double theta) {
  static_assert(detail::kSupported<T>);
  const int half = D / 2;
  constexpr int kMaxHalf = 1024;
  float inv_freq[kMaxHalf];
  const float base = (float)theta;
  for (int i0 = 0; i0 < half; i0 += kMaxHalf) {
    const int i1 = std::min(half, i0 + kMaxHalf);
    for (int i = i0; i < i1; ++i) {
      const float expo = (float)(2 * i) / (float)D;
      const float p = (float)std::pow((double)base, (double)expo);
      inv_freq[i - i0] = 1.0f / p;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < Tn; ++t) {
      for (int i = i0; i < i1; ++i) {
        const float ang = (float)t * inv_freq[i - i0];
        cos[(size_t)t * half + i] = (T)(float)std::cos((double)ang);
        sin[(size_t)t * half + i] = (T)(float)std::sin((double)ang);
      }
    }
  }
}

// rotate_half convention: x1 = x[:D/2], x2 = x[D/2:];
// out1 = x1*cos - x2*sin ; out2 = x2*cos + x1*sin.  out may alias in.
template <class T>
void rope_forward(T* out, const T* in, const T* cos, const T* sin, int B, int Tn, int H, int D) {
  static_assert(detail::kSupported<T>);
  const int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const T* cs = cos + (size_t)t * half;
      const T* sn = sin + (size_t)t * half;
      for (int h = 0; h < H; ++h) {
        const size_t off = (((size_t)b * Tn + t) * H + h) * D;
        const T* x = in + off;
        T* o = out + off;
        for (int i = 0; i < half; ++i) {
          const T x1 = x[i], x2 = x[i + half];
          o[i] = x1 * cs[i] - x2 * sn[i];
          o[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
  }
}

// din += R^T dout (the inverse rotation of dout):
// din1 += g1 cos + g2 sin ; din2 += g2 cos - g1 sin.
template <class T>
void rope_backward(T* din, const T* dout, const T* cos, const T* sin, int B, int Tn, int H, int D) {
  static_assert(detail::kSupported<T>);
  if (!din) return;
  const int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const T* cs = cos + (size_t)t * half;
      const T* sn = sin + (size_t)t * half;
      for (int h = 0; h < H; ++h) {
        const size_t off = (((size_t)b * Tn + t) * H + h) * D;
        const T* g = dout + off;
        T* dx = din + off;
        for (int i = 0; i < half; ++i) {
          const T g1 = g[i], g2 = g[i + half];
          dx[i] += g1 * cs[i] + g2 * sn[i];
          dx[i + half] += g2 * cs[i] - g1 * sn[i];
        }
      }
    }
  }
}

}  // namespace kvs::cpu
