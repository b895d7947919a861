// exp that the compiler can vectorise (no calls, no branches), for the loops
// over exp in softmax, cross-entropy and SwiGLU.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace kvs::cpu::detail {

// float: Cephes' expf reduction and polynomial, within 2 ulp of the true value
// over the whole range (tested); results below e^-87.3 flush to 0, NaN/inf are
// not expected. double: std::exp (the double path is the finite-difference reference).
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

}  // namespace kvs::cpu::detail
