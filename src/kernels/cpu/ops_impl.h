// CPU reference kernels: template definitions for the signatures in ops.h.
// Included at the end of ops.h; do not include directly. Conventions, math and
// the determinism/parallelism rules are written up in docs/KERNELS.md.
//
// Every op is instantiable for float and double. Rules followed throughout:
//  - row-major, offsets computed in size_t (att is B*Hq*T*T and can pass 2^31);
//  - *_backward adds (+=) into every gradient it writes; null gradient = skip;
//  - OpenMP `parallel for schedule(static)` only over loops whose iterations
//    write disjoint outputs, and every reduction runs in a fixed order, so a
//    fixed thread count gives bit-identical results;
//  - no heap allocation: scratch is small fixed stack arrays or the buffers
//    the caller passes.
#pragma once
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvs::cpu {

namespace detail {
template <class T>
inline constexpr bool kSupported = std::is_same_v<T, float> || std::is_same_v<T, double>;

// exp that the compiler can vectorise (no calls, no branches). float: Cephes'
// expf reduction and polynomial, within 2 ulp of the true value over the whole
// range (tested); results below e^-87.3 flush to 0, NaN/inf are not expected.
// double: std::exp (the double path is the finite-difference reference).
inline float exp_fast(float x) {
  float xc = x < -87.3f ? -87.3f : x;
  xc = xc > 88.7f ? 88.7f : xc;
  // n = round(xc / ln2) with the 1.5*2^23 trick (floorf blocks vectorisation)
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;  // ln2 split in two: n * hi is exact in float
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const float scale = std::bit_cast<float>(((int32_t)n + 127) << 23);  // 2^n
  return x < -87.3f ? 0.0f : p * scale;
}
inline double exp_fast(double x) { return std::exp(x); }

// Fixed-order reductions with kLanes partial results, so the compiler can keep
// them in a vector register (a plain `sum += x` loop cannot be vectorised
// without reassociation). Deterministic: the order depends only on n.
constexpr int kLanes = 16;
template <class T> T row_max(const T* r, int n) {
  T part[kLanes];
  for (int j = 0; j < kLanes; ++j) part[j] = r[0];
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = part[j] < r[s + j] ? r[s + j] : part[j];
  T m = part[0];
  for (int j = 1; j < kLanes; ++j) m = std::max(m, part[j]);
  for (; s < n; ++s) m = std::max(m, r[s]);
  return m;
}
template <class T, class Acc = T> Acc row_sum(const T* r, int n) {
  Acc part[kLanes] = {};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += r[s + j];
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += r[s];
  return sum;
}
template <class T> T row_dot(const T* a, const T* b, int n) {
  T part[kLanes] = {};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += a[s + j] * b[s + j];
  T sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += a[s] * b[s];
  return sum;
}
}  // namespace detail

// ---------------------------------------------------------------- embedding

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, int v_begin, int v_count) {
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

// Several rows may share a token, so rows cannot be split across threads.
// Threads own disjoint column ranges instead and walk the rows in order.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C, int v_begin, int v_count) {
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

// ---------------------------------------------------------------- RMSNorm
// Row reductions accumulate in double (O(N*C), cheap) for float accuracy.

template <class T> void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + (size_t)n * C;
    T* o = out + (size_t)n * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += (double)x[c] * (double)x[c];
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
      double dot = 0.0;
      for (int c = 0; c < C; ++c) dot += (double)g[c] * (double)w[c] * (double)x[c];
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

// ---------------------------------------------------------------- matmul
// OpenBLAS GEMM splits the output (M/N) between its threads, never the K sum,
// so results are reproducible. Called from outside any OpenMP region.

namespace detail {
template <class T>
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, T alpha, const T* A, int lda,
                 const T* Bm, int ldb, T beta, T* Cm, int ldc) {
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
}
}  // namespace detail

template <class T> void matmul_forward(T* out, const T* inp, const T* W, int N, int C, int OC) {
  static_assert(detail::kSupported<T>);
  if (N == 0 || OC == 0) return;
  if (C == 0) {
    std::fill(out, out + (size_t)N * OC, T(0));
    return;
  }
  // out[N, OC] = inp[N, C] @ W[OC, C]^T   (beta = 0: out is never read)
  detail::gemm<T>(CblasNoTrans, CblasTrans, N, OC, C, T(1), inp, C, W, C, T(0), out, OC);
}

template <class T>
void matmul_backward(T* dinp, T* dW, const T* dout, const T* inp, const T* W, int N, int C, int OC) {
  static_assert(detail::kSupported<T>);
  if (N == 0 || C == 0 || OC == 0) return;
  // dinp[N, C] += dout[N, OC] @ W[OC, C]
  if (dinp) detail::gemm<T>(CblasNoTrans, CblasNoTrans, N, C, OC, T(1), dout, OC, W, C, T(1), dinp, C);
  // dW[OC, C] += dout[N, OC]^T @ inp[N, C]
  if (dW) detail::gemm<T>(CblasTrans, CblasNoTrans, OC, C, N, T(1), dout, OC, inp, C, T(1), dW, C);
}

// ---------------------------------------------------------------- KV shift
// out[b,t,h,:] = sum_{w=0..W} coef[h,w] in[b,t-W+w,h,:]  (terms with t-W+w < 0 dropped),
// summed oldest first, starting from 0.

template <class T>
void kv_shift_forward(T* out, const T* in, const T* coef, int B, int Tn, int H, int D, int W,
                      const int32_t* doc_start) {
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
                       int W, const int32_t* doc_start) {
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

// ---------------------------------------------------------------- RoPE
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

// rotate_half: out1 = x1 cos - x2 sin ; out2 = x2 cos + x1 sin (out may alias in).
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

// Transpose of the rotation: din1 += g1 cos + g2 sin ; din2 += g2 cos - g1 sin.
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

// ---------------------------------------------------------------- SwiGLU, residual

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

template <class T> void residual_forward(T* out, const T* a, const T* b, size_t n) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------- cross-entropy
// Per row (parallel over rows): pass 1 reads max, first argmax and the target
// logit; pass 2 computes e_v = exp(x_v - max) in chunks through a stack buffer
// (vectorised exp), sums them in double and copies them into dlogits when
// wanted (safe under aliasing: x_v is read first); pass 3 scales. A null mask means all ones. Rows with mask 0 get loss 0 and a
// zero gradient row, and their target is never read (it may be e.g. -1).

template <class T>
void cross_entropy_forward_backward(T* losses, T* dlogits, int32_t* argmax, const T* logits, const int32_t* targets,
                                    const float* mask, int N, int V, double grad_scale) {
  static_assert(detail::kSupported<T>);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + (size_t)n * V;
    const double m = mask ? (double)mask[n] : 1.0;
    T mx = x[0];
    int amax = 0;
    for (int v = 1; v < V; ++v) {
      if (x[v] > mx) {
        mx = x[v];
        amax = v;
      }
    }
    if (argmax) argmax[n] = amax;
    if (m == 0.0) {
      if (losses) losses[n] = T(0);
      if (dlogits) {
        T* dx = dlogits + (size_t)n * V;
        for (int v = 0; v < V; ++v) dx[v] = T(0);
      }
      continue;
    }
    const int tgt = targets[n];
    const double xt = (double)x[tgt];
    double sum = 0.0;
    constexpr int kChunk = 256;
    T e[kChunk];
    T* dx = dlogits ? dlogits + (size_t)n * V : nullptr;
    for (int v0 = 0; v0 < V; v0 += kChunk) {
      const int nv = std::min(kChunk, V - v0);
      for (int j = 0; j < nv; ++j) e[j] = detail::exp_fast(x[v0 + j] - mx);  // read before dx is written
      sum += detail::row_sum<T, double>(e, nv);
      if (dx)
        for (int j = 0; j < nv; ++j) dx[v0 + j] = e[j];
    }
    if (dx) {
      const T k = (T)(m * grad_scale / sum);
      for (int v = 0; v < V; ++v) dx[v] *= k;
      dx[tgt] -= (T)(m * grad_scale);
    }
    if (losses) losses[n] = (T)(m * ((double)mx + std::log(sum) - xt));
  }
}

}  // namespace kvs::cpu

#include "kernels/cpu/attention_impl.h"
