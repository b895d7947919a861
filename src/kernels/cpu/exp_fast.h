// exp that the compiler can vectorise (no calls, no branches), for the loops
// over exp in softmax, cross-entropy and SwiGLU.
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/row_reduce.h"

namespace kvs::cpu::detail {

// The steps shared by the scalar exp_fast and its eight-lane twin (V = float
// or f32x8, the same operations in the same order, so both give the same
// bits) on a clamped argument xc: n = round(xc / ln2) with the 1.5*2^23 trick
// (floorf blocks vectorisation), r = xc - n ln2 (ln2 split in two: n * hi is
// exact in float); returns e^r by Cephes' polynomial, the caller scales by 2^n.
template <class V> inline V exp_reduced(V xc, V& n) {
  n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}

// float: Cephes' expf reduction and polynomial, within 2 ulp of the true value
// over the whole range (tested); results below e^-87.3 flush to 0, NaN/inf are
// not expected. double: std::exp (the double path is the finite-difference reference).
inline float exp_fast(float x) {
  float xc = x < -87.3f ? -87.3f : x;
  xc = xc > 88.7f ? 88.7f : xc;
  float n;
  const float p = exp_reduced(xc, n);
  const float scale = std::bit_cast<float>(((int32_t)n + 127) << 23);  // 2^n
  return x < -87.3f ? 0.0f : p * scale;
}
inline double exp_fast(double x) { return std::exp(x); }

// Four, eight or sixteen floats as one value (GCC/Clang vector extensions:
// one SSE, AVX or AVX-512 register; a wider one than the target has is
// lowered poorly, see exp_shifted_sum). GCC (12, default -ftrapping-math)
// does not vectorise a loop that calls the scalar exp_fast on a computed
// argument: it turns its selects into branches around the arithmetic. The
// same steps on these types are vector instructions whatever the optimiser
// decides.
using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int32_t __attribute__((vector_size(16)));
using f32x8 = float __attribute__((vector_size(32)));
using i32x8 = int32_t __attribute__((vector_size(32)));
using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));

inline f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }

// exp_fast lane by lane: the same operations in the same order.
template <class V, class I> inline V exp_fast_lanes(V x) {
  const V lo = V{} - 87.3f, hi = V{} + 88.7f;
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  V n;
  const V p = exp_reduced(xc, n);
  const V scale = (V)((__builtin_convertvector(n, I) + 127) << 23);  // 2^n, bits reinterpreted
  return x < lo ? V{} : p * scale;
}
inline f32x4 exp_fast(f32x4 x) { return exp_fast_lanes<f32x4, i32x4>(x); }
inline f32x8 exp_fast(f32x8 x) { return exp_fast_lanes<f32x8, i32x8>(x); }
inline f32x16 exp_fast(f32x16 x) { return exp_fast_lanes<f32x16, i32x16>(x); }

// out[j] = exp(x[j] - shift) for j < n (eight lanes at a time, then one by
// one: the scalar exp_fast's bits either way). out may be x.
inline void exp_shifted(float* out, const float* x, int n, float shift) {
  int j = 0;
  for (; j + 8 <= n; j += 8) store8(out + j, exp_fast(load8(x + j) - shift));
  for (; j < n; ++j) out[j] = exp_fast(x[j] - shift);
}
inline void exp_shifted(double* out, const double* x, int n, double shift) {
  for (int j = 0; j < n; ++j) out[j] = std::exp(x[j] - shift);
}

// r[s] = exp(r[s] - shift) for s < n; returns their sum (float: kLanes = 16
// lanes, then eight, then the tail one by one: a fixed order for a given n).
// The sixteen lanes are row_reduce.h's Lanes, in registers of B bytes: one
// f32x16 with AVX-512, two f32x8 with AVX2 (as one f32x16 there GCC 12 went
// through the stack lane by lane: 4.4 ns per element on a Zen 3 core, 0.7 as
// two). Every lane does the same work whatever B is (tested bit for bit).
template <int B = kRegBytes> inline float exp_shifted_sum(float* r, int n, float shift) {
  Lanes<float, B> acc{};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes) {
    Lanes<float, B> e = load_lanes<B>(r + s);
#pragma GCC unroll 4
    for (int i = 0; i < e.kRegs; ++i) e.r[i] = exp_fast(e.r[i] - shift);
    store_lanes(r + s, e);
    acc += e;
  }
  float sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
  exp_shifted(r + s, r + s, n - s, shift);  // the last n % 16: eight lanes, then one by one
  for (; s < n; ++s) sum += r[s];
  return sum;
}
inline double exp_shifted_sum(double* r, int n, double shift) {
  double sum = 0;
  for (int s = 0; s < n; ++s) sum += r[s] = std::exp(r[s] - shift);
  return sum;
}

}  // namespace kvs::cpu::detail
