// Rotary position embedding in Hugging Face's rotate_half convention (CUDA:
// shift_rope.cu, fused with the KV shift).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/scalar_types.h"

namespace kvs::cpu {

// Which rotation frequencies: θ, and optionally Llama 3's scaling (Hugging
// Face's rope_type "llama3"), which changes only the inverse frequencies, so
// the tables below are the one place that knows about it. Implicit from θ:
// plain RoPE.
struct RopeFrequencies {
  double theta = 10000.0;
  bool llama3 = false;  // the fields below are read only when set
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;

  RopeFrequencies(double theta_ = 10000.0) : theta(theta_) {}  // NOLINT(google-explicit-constructor)
};

// inv_freq[i], i < D/2, as Hugging Face computes it in fp32 (each operation a
// correctly rounded float: pow evaluated in double, then rounded):
//   default: inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D))
//   llama3 (_compute_llama3_parameters): with wavelen = 2*pi / inv_freq,
//     wavelen > old_ctx / low_freq_factor    -> inv_freq / factor        (low frequencies)
//     wavelen < old_ctx / high_freq_factor   -> inv_freq                 (high frequencies)
//     otherwise, s = (old_ctx / wavelen - low) / (high - low):
//                                            -> (1 - s) * inv_freq / factor + s * inv_freq
inline void rope_inv_freq(float* inv_freq, int D, const RopeFrequencies& f) {
  const float base = (float)f.theta;
  for (int i = 0; i < D / 2; ++i) {
    const float expo = (float)(2 * i) / (float)D;
    inv_freq[i] = 1.0f / (float)std::pow((double)base, (double)expo);
  }
  if (!f.llama3) return;
  // Torch's fp32 arithmetic, operation by operation: a Python scalar meets an fp32 tensor as a
  // float; `scalar / tensor` is reciprocal(tensor) * scalar; every product is rounded on its own
  // (no fused multiply-add, which -march=native would otherwise allow: hence the volatile).
  const float factor = (float)f.factor, low = (float)f.low_freq_factor;
  const float span = (float)(f.high_freq_factor - f.low_freq_factor);
  const float old_ctx = (float)f.original_max_position_embeddings;
  const float low_wavelen = (float)((double)f.original_max_position_embeddings / f.low_freq_factor);
  const float high_wavelen = (float)((double)f.original_max_position_embeddings / f.high_freq_factor);
  const float two_pi = (float)(2.0 * 3.14159265358979323846);
  for (int i = 0; i < D / 2; ++i) {
    const float wavelen = (1.0f / inv_freq[i]) * two_pi;
    const float scaled = wavelen > low_wavelen ? inv_freq[i] / factor : inv_freq[i];
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      inv_freq[i] = scaled;
      continue;
    }
    const volatile float ratio = (1.0f / wavelen) * old_ctx;
    const float s = (ratio - low) / span;
    const volatile float kept = s * scaled;
    inv_freq[i] = (1.0f - s) * scaled / factor + kept;
  }
}

// RoPE tables [Tn, D/2] in Hugging Face's convention, computed in fp32 like HF:
//   freqs   = float(t) * inv_freq          (float32 product)
//   cos/sin = freqs.cos() / freqs.sin()    (float32, evaluated in double and rounded)
// then stored as T.
template <class T> void rope_tables(T* cos, T* sin, int Tn, int D, const RopeFrequencies& f) {
  static_assert(detail::kSupported<T>);
  const int half = D / 2;
  std::vector<float> inv_freq(half);
  rope_inv_freq(inv_freq.data(), D, f);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < Tn; ++t) {
    for (int i = 0; i < half; ++i) {
      const float ang = (float)t * inv_freq[i];
      cos[(size_t)t * half + i] = (T)(float)std::cos((double)ang);
      sin[(size_t)t * half + i] = (T)(float)std::sin((double)ang);
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
// With overwrite, din is written instead of added into (no zeroing pass first).
template <class T>
void rope_backward(T* din, const T* dout, const T* cos, const T* sin, int B, int Tn, int H, int D,
                   bool overwrite = false) {
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
          const T d1 = g1 * cs[i] + g2 * sn[i], d2 = g2 * cs[i] - g1 * sn[i];
          dx[i] = overwrite ? d1 : dx[i] + d1;
          dx[i + half] = overwrite ? d2 : dx[i + half] + d2;
        }
      }
    }
  }
}

}  // namespace kvs::cpu
