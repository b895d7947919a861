// CPU kernels: every backward against central finite differences (double),
// forwards against straightforward independent formulas, float vs double
// agreement, the += convention and bit-for-bit determinism.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/ops.h"

namespace {

using namespace kvs::cpu;
using Vec = std::vector<double>;
using FVec = std::vector<float>;

Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * kvs::normal01(seed, i);
  return v;
}
FVec to_float(const Vec& v) { return FVec(v.begin(), v.end()); }
Vec to_double(const FVec& v) { return Vec(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double norm(const Vec& a) { return std::sqrt(dot(a, a)); }
// ||a - b|| / ||b||
double rel_err(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(d) / std::max(norm(b), 1e-300);
}
Vec add(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] + b[i];
  return c;
}

// Central differences of the scalar f() with respect to every element of x
// (x is perturbed in place and restored).
Vec numgrad(Vec& x, const std::function<double()>& f, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f();
    x[i] = x0 - eps;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2 * eps);
  }
  return g;
}

// Analytic gradient vs finite differences, and the gradient is not trivially small.
void expect_grad_close(const Vec& analytic, const Vec& numeric, const char* what, double tol = 1e-6) {
  EXPECT_GT(norm(numeric), 1e-3) << what << ": gradient too small for a meaningful check";
  EXPECT_LT(rel_err(analytic, numeric), tol) << what;
}

constexpr double kFloatTol = 1e-5;  // float vs double, relative to the norm

// ------------------------------------------------------------------ embedding

TEST(OpsEmbedding, ForwardGathersRowsAndBackwardMatchesFiniteDifferences) {
  const int N = 9, C = 5, Vocab = 4;
  std::vector<int32_t> tok(N);
  for (int n = 0; n < N; ++n) tok[n] = (n * 7 + 1) % Vocab;  // repeats
  Vec wte = randn((size_t)Vocab * C, 1), R = randn((size_t)N * C, 2), out((size_t)N * C);
  embedding_forward(out.data(), tok.data(), wte.data(), N, C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[(size_t)n * C + c], wte[(size_t)tok[n] * C + c]);

  auto f = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), N, C);
    return dot(out, R);
  };
  Vec g0 = randn(wte.size(), 3), g = g0, fresh(wte.size(), 0.0);
  embedding_backward(fresh.data(), R.data(), tok.data(), N, C);
  embedding_backward(g.data(), R.data(), tok.data(), N, C);
  expect_grad_close(fresh, numgrad(wte, f), "dwte");
  EXPECT_LT(rel_err(g, add(g0, fresh)), 1e-14) << "backward must accumulate";

  FVec gf(wte.size(), 0.f);
  embedding_backward(gf.data(), to_float(R).data(), tok.data(), N, C);
  EXPECT_LT(rel_err(to_double(gf), fresh), kFloatTol);
}

// ------------------------------------------------------------------ RMSNorm

TEST(OpsRmsNorm, ForwardMatchesDirectFormula) {
  const int N = 5, C = 11;
  const double eps = 1e-5;
  Vec x = randn((size_t)N * C, 10), w = randn(C, 11), out((size_t)N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c] / C;
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(ms + eps), 1e-12);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[n * C + c], x[n * C + c] / std::sqrt(ms + eps) * w[c], 1e-12);
  }
}

TEST(OpsRmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 4, C = 70;  // C > 64: two column chunks in the dw reduction
  const double eps = 1e-5;
  Vec x = randn((size_t)N * C, 20), w = randn(C, 21), R = randn((size_t)N * C, 22);
  Vec out((size_t)N * C), rstd(N);
  auto f = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(out, R);
  };
  f();
  Vec dx(x.size(), 0.0), dw(C, 0.0);
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_grad_close(dx, numgrad(x, f), "dinp");
  expect_grad_close(dw, numgrad(w, f), "dw");

  // Accumulation into non-zero buffers; null pointers are skipped.
  Vec dx0 = randn(x.size(), 23), dw0 = randn(C, 24), dx2 = dx0, dw2 = dw0;
  rmsnorm_backward(dx2.data(), (double*)nullptr, R.data(), x.data(), w.data(), rstd.data(), N, C);
  rmsnorm_backward((double*)nullptr, dw2.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_LT(rel_err(dx2, add(dx0, dx)), 1e-14);
  EXPECT_LT(rel_err(dw2, add(dw0, dw)), 1e-14);

  // float agrees with double
  FVec xf = to_float(x), wf = to_float(w), Rf = to_float(R), of(out.size()), rf(N), dxf(x.size(), 0.f), dwf(C, 0.f);
  rmsnorm_forward(of.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
  rmsnorm_backward(dxf.data(), dwf.data(), Rf.data(), xf.data(), wf.data(), rf.data(), N, C);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(dxf), dx), kFloatTol);
  EXPECT_LT(rel_err(to_double(dwf), dw), kFloatTol);
}

TEST(OpsRmsNorm, FloatBackwardIsBitwiseDeterministic) {
  const int N = 300, C = 200;
  FVec x = to_float(randn((size_t)N * C, 30)), w = to_float(randn(C, 31)), g = to_float(randn((size_t)N * C, 32));
  FVec out(x.size()), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  FVec dx1(x.size(), 0.f), dw1(C, 0.f), dx2(x.size(), 0.f), dw2(C, 0.f);
  rmsnorm_backward(dx1.data(), dw1.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  rmsnorm_backward(dx2.data(), dw2.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
}

// ------------------------------------------------------------------ matmul

TEST(OpsMatmul, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 7, OC = 6;
  Vec x = randn((size_t)N * C, 40), W = randn((size_t)OC * C, 41), R = randn((size_t)N * OC, 42);
  Vec out((size_t)N * OC, std::nan(""));  // forward overwrites (beta = 0)
  matmul_forward(out.data(), x.data(), W.data(), N, C, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += x[n * C + c] * W[o * C + c];
      EXPECT_NEAR(out[n * OC + o], s, 1e-12);
    }
  auto f = [&] {
    matmul_forward(out.data(), x.data(), W.data(), N, C, OC);
    return dot(out, R);
  };
  Vec dx0 = randn(x.size(), 43), dW0 = randn(W.size(), 44), dx = dx0, dW = dW0;
  Vec dxf(x.size(), 0.0), dWf(W.size(), 0.0);
  matmul_backward(dxf.data(), dWf.data(), R.data(), x.data(), W.data(), N, C, OC);
  matmul_backward(dx.data(), dW.data(), R.data(), x.data(), W.data(), N, C, OC);
  expect_grad_close(dxf, numgrad(x, f), "dinp");
  expect_grad_close(dWf, numgrad(W, f), "dW");
  EXPECT_LT(rel_err(dx, add(dx0, dxf)), 1e-14);
  EXPECT_LT(rel_err(dW, add(dW0, dWf)), 1e-14);

  // float (sgemm) vs double (dgemm), on a size where sgemm uses its blocked kernels
  const int N2 = 64, C2 = 96, OC2 = 80;
  Vec x2 = randn((size_t)N2 * C2, 45), W2 = randn((size_t)OC2 * C2, 46), g2 = randn((size_t)N2 * OC2, 47);
  Vec o2((size_t)N2 * OC2), dx2(x2.size(), 0.0), dW2(W2.size(), 0.0);
  matmul_forward(o2.data(), x2.data(), W2.data(), N2, C2, OC2);
  matmul_backward(dx2.data(), dW2.data(), g2.data(), x2.data(), W2.data(), N2, C2, OC2);
  FVec x2f = to_float(x2), W2f = to_float(W2), g2f = to_float(g2), o2f(o2.size()), dx2f(x2.size(), 0.f),
       dW2f(W2.size(), 0.f);
  matmul_forward(o2f.data(), x2f.data(), W2f.data(), N2, C2, OC2);
  matmul_backward(dx2f.data(), dW2f.data(), g2f.data(), x2f.data(), W2f.data(), N2, C2, OC2);
  EXPECT_LT(rel_err(to_double(o2f), o2), kFloatTol);
  EXPECT_LT(rel_err(to_double(dx2f), dx2), kFloatTol);
  EXPECT_LT(rel_err(to_double(dW2f), dW2), kFloatTol);
}

// ------------------------------------------------------------------ KV shift

TEST(OpsKvShift, WindowOneMatchesDirectFormula) {
  const int B = 2, T = 5, H = 3, D = 4;
  Vec x = randn((size_t)B * T * H * D, 50), coef = randn(H * 2, 51), out(x.size());
  kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, 1);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t i = (((size_t)b * T + t) * H + h) * D + d;
          const double prev = t > 0 ? x[i - (size_t)H * D] : 0.0;
          EXPECT_NEAR(out[i], coef[h * 2 + 0] * prev + coef[h * 2 + 1] * x[i], 1e-14);
        }
  // window 1 with coef (0, 1) is the identity, (1, 0) the pure shift.
  Vec id(H * 2), sh(H * 2);
  for (int h = 0; h < H; ++h) id[h * 2 + 1] = 1, sh[h * 2] = 1;
  kv_shift_forward(out.data(), x.data(), id.data(), B, T, H, D, 1);
  EXPECT_EQ(out, x);
  kv_shift_forward(out.data(), x.data(), sh.data(), B, T, H, D, 1);
  EXPECT_EQ(out[(((size_t)1 * T + 3) * H + 2) * D + 1], x[(((size_t)1 * T + 2) * H + 2) * D + 1]);
  EXPECT_EQ(out[(((size_t)1 * T + 0) * H + 2) * D + 1], 0.0);
}

TEST(OpsKvShift, BackwardMatchesFiniteDifferences) {
  for (int W : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "window " << W);
    const int B = 2, T = 6, H = 3, D = 4;
    Vec x = randn((size_t)B * T * H * D, 60 + W), coef = randn((size_t)H * (W + 1), 70 + W);
    Vec R = randn(x.size(), 80 + W), out(x.size());
    auto f = [&] {
      kv_shift_forward(out.data(), x.data(), coef.data(), B, T, H, D, W);
      return dot(out, R);
    };
    Vec dx0 = randn(x.size(), 90), dc0 = randn(coef.size(), 91), dx = dx0, dc = dc0;
    Vec dxf(x.size(), 0.0), dcf(coef.size(), 0.0);
    kv_shift_backward(dxf.data(), dcf.data(), R.data(), x.data(), coef.data(), B, T, H, D, W);
    kv_shift_backward(dx.data(), dc.data(), R.data(), x.data(), coef.data(), B, T, H, D, W);
    expect_grad_close(dxf, numgrad(x, f), "din");
    expect_grad_close(dcf, numgrad(coef, f), "dcoef");
    EXPECT_LT(rel_err(dx, add(dx0, dxf)), 1e-14);
    EXPECT_LT(rel_err(dc, add(dc0, dcf)), 1e-14);

    FVec xf = to_float(x), cf = to_float(coef), Rf = to_float(R), of(x.size()), dxff(x.size(), 0.f),
         dcff(coef.size(), 0.f);
    f();
    kv_shift_forward(of.data(), xf.data(), cf.data(), B, T, H, D, W);
    kv_shift_backward(dxff.data(), dcff.data(), Rf.data(), xf.data(), cf.data(), B, T, H, D, W);
    EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
    EXPECT_LT(rel_err(to_double(dxff), dxf), kFloatTol);
    EXPECT_LT(rel_err(to_double(dcff), dcf), kFloatTol);
  }
}

// ------------------------------------------------------------------ RoPE

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

// ------------------------------------------------------------------ attention

struct AttnShape {
  int B, T, Hq, Hkv, D;
};

// Textbook causal attention (no tiling), for the forward check.
void naive_attention(Vec& out, Vec& att, const Vec& q, const Vec& k, const Vec& v, AttnShape s) {
  const int G = s.Hq / s.Hkv;
  out.assign((size_t)s.B * s.T * s.Hq * s.D, 0.0);
  att.assign((size_t)s.B * s.Hq * s.T * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h)
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < s.D; ++i)
            d += q[(((size_t)b * s.T + t) * s.Hq + h) * s.D + i] * k[(((size_t)b * s.T + u) * s.Hkv + h / G) * s.D + i];
          sc[u] = d / std::sqrt((double)s.D);
          mx = std::max(mx, sc[u]);
        }
        double z = 0;
        for (int u = 0; u <= t; ++u) z += std::exp(sc[u] - mx);
        for (int u = 0; u <= t; ++u) {
          const double p = std::exp(sc[u] - mx) / z;
          att[(((size_t)b * s.Hq + h) * s.T + t) * s.T + u] = p;
          for (int i = 0; i < s.D; ++i)
            out[(((size_t)b * s.T + t) * s.Hq + h) * s.D + i] +=
                p * v[(((size_t)b * s.T + u) * s.Hkv + h / G) * s.D + i];
        }
      }
}

struct AttnData {
  AttnShape s;
  Vec q, k, v, R;
  AttnData(AttnShape sh, uint64_t seed) : s(sh) {
    q = randn((size_t)s.B * s.T * s.Hq * s.D, seed, 1.5);
    k = randn((size_t)s.B * s.T * s.Hkv * s.D, seed + 1, 1.5);
    v = randn((size_t)s.B * s.T * s.Hkv * s.D, seed + 2);
    R = randn(q.size(), seed + 3);
  }
  size_t natt() const { return (size_t)s.B * s.Hq * s.T * s.T; }
};

class OpsAttention : public testing::TestWithParam<AttnShape> {};

TEST_P(OpsAttention, ForwardMatchesNaiveAndProbabilitiesAreCausal) {
  const AttnShape s = GetParam();
  AttnData a(s, 200);
  Vec out(a.q.size()), att(a.natt(), std::nan("")), ref_out, ref_att;
  attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  naive_attention(ref_out, ref_att, a.q, a.k, a.v, s);
  EXPECT_LT(rel_err(out, ref_out), 1e-13);
  EXPECT_LT(rel_err(att, ref_att), 1e-13);
  for (int bh = 0; bh < s.B * s.Hq; ++bh)
    for (int t = 0; t < s.T; ++t) {
      double sum = 0;
      for (int u = 0; u < s.T; ++u) {
        const double p = att[((size_t)bh * s.T + t) * s.T + u];
        if (u > t)
          ASSERT_EQ(p, 0.0) << "above the diagonal";
        else
          sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-13);
    }
}

TEST_P(OpsAttention, BackwardMatchesFiniteDifferences) {
  const AttnShape s = GetParam();
  AttnData a(s, 300);
  Vec out(a.q.size()), att(a.natt()), datt(a.natt());
  auto f = [&] {
    attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
    return dot(out, a.R);
  };
  f();
  Vec dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  expect_grad_close(dq, numgrad(a.q, f), "dq");
  expect_grad_close(dk, numgrad(a.k, f), "dk");
  expect_grad_close(dv, numgrad(a.v, f), "dv");

  // Accumulation, and gradients requested one at a time give the same values.
  f();
  Vec q0 = randn(dq.size(), 310), k0 = randn(dk.size(), 311), v0 = randn(dv.size(), 312);
  Vec dq2 = q0, dk2 = k0, dv2 = v0;
  attention_backward(dq2.data(), (double*)nullptr, (double*)nullptr, datt.data(), a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward((double*)nullptr, dk2.data(), (double*)nullptr, datt.data(), a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward((double*)nullptr, (double*)nullptr, dv2.data(), datt.data(), a.R.data(), a.q.data(), a.k.data(),
                     a.v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_LT(rel_err(dq2, add(q0, dq)), 1e-13);
  EXPECT_LT(rel_err(dk2, add(k0, dk)), 1e-13);
  EXPECT_LT(rel_err(dv2, add(v0, dv)), 1e-13);
}

TEST_P(OpsAttention, FloatAgreesWithDouble) {
  const AttnShape s = GetParam();
  AttnData a(s, 400);
  Vec out(a.q.size()), att(a.natt()), datt(a.natt()), dq(a.q.size(), 0.0), dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
  attention_forward(out.data(), att.data(), a.q.data(), a.k.data(), a.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dq.data(), dk.data(), dv.data(), datt.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  FVec qf = to_float(a.q), kf = to_float(a.k), vf = to_float(a.v), Rf = to_float(a.R);
  FVec of(out.size()), attf(att.size()), dattf(att.size()), dqf(dq.size(), 0.f), dkf(dk.size(), 0.f),
      dvf(dv.size(), 0.f);
  attention_forward(of.data(), attf.data(), qf.data(), kf.data(), vf.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dqf.data(), dkf.data(), dvf.data(), dattf.data(), Rf.data(), qf.data(), kf.data(), vf.data(),
                     attf.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(attf), att), kFloatTol);
  EXPECT_LT(rel_err(to_double(dqf), dq), kFloatTol);
  EXPECT_LT(rel_err(to_double(dkf), dk), kFloatTol);
  EXPECT_LT(rel_err(to_double(dvf), dv), kFloatTol);
}

std::string shape_name(const testing::TestParamInfo<AttnShape>& i) {
  const AttnShape& s = i.param;
  return fmt::format("B{}T{}Hq{}Hkv{}D{}", s.B, s.T, s.Hq, s.Hkv, s.D);
}

// D = 4..8 run the generic path, 32/64 the specialised ones; T = 34 and 70 cross
// the 32-key tiles, T = 70 also the 64-row forward blocks.
INSTANTIATE_TEST_SUITE_P(OpsShapes, OpsAttention,
                         testing::Values(AttnShape{2, 5, 2, 2, 4}, AttnShape{1, 6, 2, 2, 8}, AttnShape{2, 7, 4, 2, 6},
                                         AttnShape{1, 5, 4, 2, 8}, AttnShape{1, 7, 4, 1, 5}, AttnShape{1, 6, 2, 1, 64},
                                         AttnShape{1, 70, 2, 1, 4}, AttnShape{1, 34, 2, 1, 32}),
                         shape_name);

TEST(OpsAttentionGqa, SingleKvHeadEqualsMhaWithReplicatedKv) {
  const AttnShape g{2, 9, 3, 1, 8}, m{2, 9, 3, 3, 8};
  AttnData a(g, 500);
  // Replicate the single KV head per query head for the MHA run.
  Vec k3((size_t)m.B * m.T * m.Hkv * m.D), v3(k3.size());
  for (int bt = 0; bt < m.B * m.T; ++bt)
    for (int h = 0; h < m.Hkv; ++h)
      for (int d = 0; d < m.D; ++d) {
        k3[((size_t)bt * m.Hkv + h) * m.D + d] = a.k[(size_t)bt * m.D + d];
        v3[((size_t)bt * m.Hkv + h) * m.D + d] = a.v[(size_t)bt * m.D + d];
      }
  const size_t natt = (size_t)g.B * g.Hq * g.T * g.T;
  Vec og(a.q.size()), attg(natt), om(a.q.size()), attm(natt), datt(natt);
  attention_forward(og.data(), attg.data(), a.q.data(), a.k.data(), a.v.data(), g.B, g.T, g.Hq, g.Hkv, g.D);
  attention_forward(om.data(), attm.data(), a.q.data(), k3.data(), v3.data(), m.B, m.T, m.Hq, m.Hkv, m.D);
  EXPECT_EQ(og, om);
  EXPECT_EQ(attg, attm);
  // Backward: the GQA dk/dv are the sums over the replicated heads' gradients.
  Vec dqg(a.q.size(), 0.0), dkg(a.k.size(), 0.0), dvg(a.v.size(), 0.0);
  Vec dqm(a.q.size(), 0.0), dkm(k3.size(), 0.0), dvm(v3.size(), 0.0);
  attention_backward(dqg.data(), dkg.data(), dvg.data(), datt.data(), a.R.data(), a.q.data(), a.k.data(), a.v.data(),
                     attg.data(), g.B, g.T, g.Hq, g.Hkv, g.D);
  attention_backward(dqm.data(), dkm.data(), dvm.data(), datt.data(), a.R.data(), a.q.data(), k3.data(), v3.data(),
                     attm.data(), m.B, m.T, m.Hq, m.Hkv, m.D);
  EXPECT_LT(rel_err(dqg, dqm), 1e-14);
  Vec dks(a.k.size(), 0.0), dvs(a.v.size(), 0.0);
  for (int bt = 0; bt < m.B * m.T; ++bt)
    for (int h = 0; h < m.Hkv; ++h)
      for (int d = 0; d < m.D; ++d) {
        dks[(size_t)bt * m.D + d] += dkm[((size_t)bt * m.Hkv + h) * m.D + d];
        dvs[(size_t)bt * m.D + d] += dvm[((size_t)bt * m.Hkv + h) * m.D + d];
      }
  EXPECT_LT(rel_err(dkg, dks), 1e-14);
  EXPECT_LT(rel_err(dvg, dvs), 1e-14);
}

TEST(OpsAttentionDeterminism, FloatBackwardIsBitwiseDeterministic) {
  const AttnShape s{2, 70, 4, 2, 64};
  AttnData a(s, 600);
  FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v), g = to_float(a.R);
  FVec out(q.size()), att(a.natt()), datt(a.natt());
  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  FVec dq1(q.size(), 0.f), dk1(k.size(), 0.f), dv1(v.size(), 0.f);
  FVec dq2(q.size(), 0.f), dk2(k.size(), 0.f), dv2(v.size(), 0.f);
  attention_backward(dq1.data(), dk1.data(), dv1.data(), datt.data(), g.data(), q.data(), k.data(), v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  attention_backward(dq2.data(), dk2.data(), dv2.data(), datt.data(), g.data(), q.data(), k.data(), v.data(),
                     att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
}

// ------------------------------------------------------------------ SwiGLU, residual

TEST(OpsSwiglu, ForwardAndBackward) {
  const size_t n = 37;
  Vec g = randn(n, 700, 3.0), u = randn(n, 701), R = randn(n, 702), out(n);
  g[0] = -120.0;  // far tail: silu -> 0 without overflow trouble
  swiglu_forward(out.data(), g.data(), u.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], g[i] / (1.0 + std::exp(-g[i])) * u[i], 1e-14);
  auto f = [&] {
    swiglu_forward(out.data(), g.data(), u.data(), n);
    return dot(out, R);
  };
  Vec dg0 = randn(n, 703), du0 = randn(n, 704), dg = dg0, du = du0, dgf(n, 0.0), duf(n, 0.0);
  swiglu_backward(dgf.data(), duf.data(), R.data(), g.data(), u.data(), n);
  swiglu_backward(dg.data(), du.data(), R.data(), g.data(), u.data(), n);
  expect_grad_close(dgf, numgrad(g, f), "dgate");
  expect_grad_close(duf, numgrad(u, f), "dup");
  EXPECT_LT(rel_err(dg, add(dg0, dgf)), 1e-14);
  EXPECT_LT(rel_err(du, add(du0, duf)), 1e-14);

  FVec gf = to_float(g), uf = to_float(u), Rf = to_float(R), of(n), dgff(n, 0.f), duff(n, 0.f);
  f();
  swiglu_forward(of.data(), gf.data(), uf.data(), n);
  swiglu_backward(dgff.data(), duff.data(), Rf.data(), gf.data(), uf.data(), n);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
  EXPECT_LT(rel_err(to_double(dgff), dgf), kFloatTol);
  EXPECT_LT(rel_err(to_double(duff), duf), kFloatTol);
}

TEST(OpsResidual, AddsAndMayAlias) {
  const size_t n = 29;
  Vec a = randn(n, 800), b = randn(n, 801), out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  residual_forward(a.data(), a.data(), b.data(), n);
  EXPECT_EQ(a, out);
  FVec af = to_float(randn(n, 800)), bf = to_float(b), of(n);
  residual_forward(of.data(), af.data(), bf.data(), n);
  EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
}

// ------------------------------------------------------------------ cross-entropy

TEST(OpsCrossEntropy, LossMatchesLogSoftmaxAndGradientMatchesFiniteDifferences) {
  const int N = 6, V = 11;
  const double gs = 0.37;
  Vec logits = randn((size_t)N * V, 900, 2.0);
  logits[3 * V + 2] = logits[3 * V + 7] = 50.0;  // tie: argmax is the first one
  logits[4 * V + 1] = 1000.0;                    // needs the max subtraction
  std::vector<int32_t> tgt = {3, 0, 10, 7, 1, -1};
  std::vector<float> mask = {1, 0.5f, 0, 1, 1, 0};  // row 5 masked with an invalid target
  Vec losses(N, std::nan(""));
  Vec dl((size_t)N * V, std::nan(""));
  std::vector<int32_t> am(N, -5);
  cross_entropy_forward_backward(losses.data(), dl.data(), am.data(), logits.data(), tgt.data(), mask.data(), N, V, gs);
  for (int n = 0; n < N; ++n) {
    const double* x = &logits[(size_t)n * V];
    const double mx = *std::max_element(x, x + V);
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(x[v] - mx);
    const double logp_t = mask[n] ? x[tgt[n]] - mx - std::log(z) : 0.0;
    EXPECT_NEAR(losses[n], -mask[n] * logp_t, 1e-12) << "row " << n;
    EXPECT_EQ(am[n], (int)(std::max_element(x, x + V) - x));
  }
  EXPECT_EQ(am[3], 2);
  EXPECT_EQ(am[4], 1);
  EXPECT_NEAR(losses[4], 0.0, 1e-12);

  // d(sum of losses)/dlogits, scaled by grad_scale
  Vec tmp(N);
  auto f = [&] {
    cross_entropy_forward_backward(tmp.data(), (double*)nullptr, (int32_t*)nullptr, logits.data(), tgt.data(),
                                   mask.data(), N, V, gs);
    double s = 0;
    for (double l : tmp) s += l;
    return s;
  };
  Vec ng = numgrad(logits, f, 1e-5);
  for (double& x : ng) x *= gs;
  expect_grad_close(dl, ng, "dlogits");
  for (int v = 0; v < V; ++v) EXPECT_EQ(dl[(size_t)2 * V + v], 0.0) << "masked row";

  // dlogits may alias logits.
  Vec inplace = logits, l2(N);
  cross_entropy_forward_backward(l2.data(), inplace.data(), (int32_t*)nullptr, inplace.data(), tgt.data(), mask.data(),
                                 N, V, gs);
  EXPECT_EQ(l2, losses);
  EXPECT_EQ(inplace, dl);

  // float agrees with double (the extreme rows excluded from the relative norm
  // would dominate nothing: they are ordinary rows for this check).
  FVec lf = to_float(logits), lossf(N), dlf(dl.size());
  cross_entropy_forward_backward(lossf.data(), dlf.data(), (int32_t*)nullptr, lf.data(), tgt.data(), mask.data(), N, V,
                                 gs);
  EXPECT_LT(rel_err(to_double(lossf), losses), kFloatTol);
  EXPECT_LT(rel_err(to_double(dlf), dl), kFloatTol);
}

TEST(OpsExp, FastFloatExpIsAccurate) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * (float)i / 200000.0f;
    const double ref = std::exp((double)x);
    worst = std::max(worst, std::fabs(kvs::cpu::detail::exp_fast(x) - ref) / ref);
  }
  EXPECT_LT(worst, 2.5e-7);  // about 2 ulp
  EXPECT_EQ(kvs::cpu::detail::exp_fast(0.0f), 1.0f);
  EXPECT_EQ(kvs::cpu::detail::exp_fast(-100.0f), 0.0f);
}

}  // namespace
