// CPU RoPE: the tables against Hugging Face's fp32 arithmetic, the rotation
// against rotate_half, the backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsRope, TablesFollowHuggingFaceFp32) {
  const int T = 8192, D = 64, half = D / 2;
  const double theta = 10000.0;
  FVec cf((size_t)T * half), sf((size_t)T * half);
  Vec cd((size_t)T * half), sd((size_t)T * half);
  rope_tables(cf.data(), sf.data(), T, D, theta);
  rope_tables(cd.data(), sd.data(), T, D, theta);
  // Known values: inv_freq[1] = 10000^(-2/64); position 1, frequency 0 is angle 1.
  EXPECT_NEAR(cd[0 * half + 0], 1.0, 0.0);
  EXPECT_NEAR(cd[1 * half + 0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(sd[1 * half + 1], std::sin(0.74989420933245582), 1e-7);
  double max_fp32 = 0, max_fp64 = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      // HF: inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D)); freqs = t * inv_freq (all fp32)
      const float inv = 1.0f / std::pow((float)theta, (float)(2 * i) / (float)D);
      const float ang = (float)t * inv;
      const size_t k = (size_t)t * half + i;
      max_fp32 = std::max({max_fp32, std::fabs((double)cf[k] - std::cos((double)ang)),
                           std::fabs((double)sf[k] - std::sin((double)ang))});
      // The same angle in fp64 drifts away at large t (the fp32 rounding of t * inv_freq).
      const double angd = t * std::pow(theta, -2.0 * i / D);
      max_fp64 = std::max(max_fp64, std::fabs(cd[k] - std::cos(angd)));
      // Computed in float, stored as T: the double tables are the float values.
      ASSERT_EQ(cd[k], (double)cf[k]);
      ASSERT_EQ(sd[k], (double)sf[k]);
    }
  EXPECT_LT(max_fp32, 1e-6);
  EXPECT_GT(max_fp64, 1e-5);
}

TEST(OpsRope, ForwardMatchesRotateHalfAndBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 5, H = 3, D = 8, half = D / 2;
  Vec cs((size_t)T * half), sn((size_t)T * half);
  rope_tables(cs.data(), sn.data(), T, D, 500000.0);
  Vec x = randn((size_t)B * T * H * D, 100), R = randn(x.size(), 101), out(x.size());
  rope_forward(out.data(), x.data(), cs.data(), sn.data(), B, T, H, D);
  // HF: q_embed = q * cos + rotate_half(q) * sin, cos = cat(freqs, freqs).cos(),
  // rotate_half(x) = cat(-x2, x1).
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const double* xv = &x[(((size_t)b * T + t) * H + h) * D];
        for (int d = 0; d < D; ++d) {
          const double rot = d < half ? -xv[d + half] : xv[d - half];
          const float ang = (float)t * (1.0f / std::pow(500000.0f, (float)(2 * (d % half)) / (float)D));
          const double c = std::cos(ang), s = std::sin(ang);
          EXPECT_NEAR(out[(((size_t)b * T + t) * H + h) * D + d], xv[d] * c + rot * s, 1e-6);
          EXPECT_NEAR(out[(((size_t)b * T + t) * H + h) * D + d],
                      xv[d] * cs[t * half + d % half] + rot * sn[t * half + d % half], 1e-14);
        }
      }
  // in place
  Vec y = x;
  rope_forward(y.data(), y.data(), cs.data(), sn.data(), B, T, H, D);
  EXPECT_EQ(y, out);

  auto f = [&] {
    rope_forward(out.data(), x.data(), cs.data(), sn.data(), B, T, H, D);
    return dot(out, R);
  };
  Vec d0 = randn(x.size(), 102), dx = d0, dxf(x.size(), 0.0);
  rope_backward(dxf.data(), R.data(), cs.data(), sn.data(), B, T, H, D);
  rope_backward(dx.data(), R.data(), cs.data(), sn.data(), B, T, H, D);
  expect_grad_close(dxf, numgrad(x, f), "din");
  EXPECT_LT(rel_err(dx, add(d0, dxf)), 1e-14);

  FVec cf((size_t)T * half), sf((size_t)T * half), xf = to_float(x), Rf = to_float(R), of(x.size()), dxff(x.size(), 0.f);
  rope_tables(cf.data(), sf.data(), T, D, 500000.0);
  rope_forward(of.data(), xf.data(), cf.data(), sf.data(), B, T, H, D);
  rope_backward(dxff.data(), Rf.data(), cf.data(), sf.data(), B, T, H, D);
  f();
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(dxff), dxf), kFloatTol);
}

}  // namespace
