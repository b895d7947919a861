// CPU RoPE: the tables against Hugging Face's fp32 arithmetic, the rotation
// against rotate_half, the backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
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

// Llama 3's scaling (rope_type "llama3") with Llama 3.2's parameters: inv_freq bit for bit as
// transformers' LlamaRotaryEmbedding computes it (values printed by transformers 5.24 and 4.44 alike),
// in each of its three bands: high frequencies kept (i <= 28), blended (29..34), divided by the factor.
TEST(OpsRope, Llama3ScalingMatchesTransformersBitForBit) {
  const int D = 128;
  RopeFrequencies f(500000.0);
  f.llama3 = true;
  f.factor = 32.0;
  f.low_freq_factor = 1.0;
  f.high_freq_factor = 4.0;
  f.original_max_position_embeddings = 8192;
  std::vector<float> inv(D / 2), plain(D / 2);
  rope_inv_freq(inv.data(), D, f);
  rope_inv_freq(plain.data(), D, RopeFrequencies(500000.0));
  const std::pair<int, float> transformers_values[] = {
      {0, 0x1.000000p+0f},   {28, 0x1.a4ee40p-9f},  {29, 0x1.15a9f0p-9f},  {30, 0x1.524f36p-10f},
      {31, 0x1.8fca8ep-11f}, {32, 0x1.c26c40p-12f}, {33, 0x1.d32b32p-13f}, {34, 0x1.9731eep-14f},
      {35, 0x1.90d10cp-16f}, {36, 0x1.46831ap-16f}, {37, 0x1.09fb7ep-16f}, {63, 0x1.4985fep-24f}};
  for (const auto& [i, want] : transformers_values) EXPECT_EQ(inv[i], want) << "inv_freq[" << i << "]";
  for (int i = 0; i <= 28; ++i) EXPECT_EQ(inv[i], plain[i]) << i;
  for (int i = 35; i < D / 2; ++i) EXPECT_EQ(inv[i], plain[i] / 32.0f) << i;
  for (int i = 29; i <= 34; ++i) EXPECT_TRUE(inv[i] < plain[i] && inv[i] > plain[i] / 32.0f) << i;
  // Parameters where the order of torch's operations shows (2*pi / inv_freq is a reciprocal, then a
  // product): true divisions would differ at 24 and 27. Values from transformers 5.24 (torch 2.15).
  RopeFrequencies odd(123456.7);
  odd.llama3 = true;
  odd.factor = 3.7;
  odd.low_freq_factor = 0.7;
  odd.high_freq_factor = 2.0;
  odd.original_max_position_embeddings = 777;
  std::vector<float> inv_odd(D / 2);
  rope_inv_freq(inv_odd.data(), D, odd);
  const std::pair<int, float> odd_values[] = {{23, 0x1.b6b19ap-7f}, {24, 0x1.27d5b0p-7f}, {25, 0x1.8c5ed8p-8f},
                                              {26, 0x1.074a40p-8f}, {27, 0x1.59e960p-9f}, {28, 0x1.bfbbe2p-10f},
                                              {42, 0x1.024c64p-13f}};
  for (const auto& [i, want] : odd_values) EXPECT_EQ(inv_odd[i], want) << "inv_freq[" << i << "]";
  // The tables rotate by exactly these frequencies.
  const int T = 3;
  std::vector<float> cs(T * D / 2), sn(T * D / 2);
  rope_tables(cs.data(), sn.data(), T, D, f);
  for (int i = 0; i < D / 2; ++i) EXPECT_EQ(cs[D / 2 + i], (float)std::cos((double)inv[i])) << i;
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

  // overwrite: din is written, not added into: whatever it held (NaN here),
  // the values of adding into zeros.
  FVec over(x.size(), std::nanf(""));
  rope_backward(over.data(), Rf.data(), cf.data(), sf.data(), B, T, H, D, /*overwrite=*/true);
  EXPECT_EQ(over, dxff);
}

}  // namespace
