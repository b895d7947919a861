// CPU RMSNorm: the forward against the direct formula, the backward against
// finite differences, float vs double, the += convention and bit-for-bit determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

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

// The fused add + norm gives the bits of the add and the norm as two passes,
// also when resid_out aliases a (without b it is the plain norm:
// ForwardMatchesDirectFormula).
TEST(OpsRmsNorm, ResidualRmsNormEqualsTheAddThenTheNorm) {
  const int N = 37, C = 70;
  FVec a = to_float(randn((size_t)N * C, 40)), b = to_float(randn((size_t)N * C, 41)), w = to_float(randn(C, 42));
  FVec sum(a.size()), want(a.size()), want_rstd(N);
  residual_forward(sum.data(), a.data(), b.data(), a.size());
  rmsnorm_forward(want.data(), want_rstd.data(), sum.data(), w.data(), N, C, 1e-5);

  FVec resid(a.size()), out(a.size()), rstd(N);
  residual_rmsnorm_forward(resid.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C, 1e-5);
  EXPECT_EQ(resid, sum);
  EXPECT_EQ(out, want);
  EXPECT_EQ(rstd, want_rstd);

  FVec in_place = a;  // resid_out aliases a, as the block calls it
  residual_rmsnorm_forward(in_place.data(), out.data(), (float*)nullptr, in_place.data(), b.data(), w.data(), N, C,
                           1e-5);
  EXPECT_EQ(in_place, sum);
  EXPECT_EQ(out, want);
}

TEST(OpsRmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 37, C = 70;  // N > 32: two row blocks (dw partials), the last short; C > 64: two column chunks
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

// dw is summed in fixed row blocks, dx per row: 1, 2 and 3 threads give the same bits.
TEST(OpsRmsNorm, FloatBackwardDoesNotDependOnTheThreadCount) {
  const int N = 300, C = 200;
  FVec x = to_float(randn((size_t)N * C, 33)), w = to_float(randn(C, 34)), g = to_float(randn((size_t)N * C, 35));
  FVec out(x.size()), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  const int threads_before = omp_get_max_threads();
  FVec dx1, dw1;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    FVec dx(x.size(), 0.f), dw(C, 0.f);
    rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    if (threads == 1) {
      dx1 = dx;
      dw1 = dw;
      continue;
    }
    EXPECT_EQ(dx, dx1) << threads << " threads";
    EXPECT_EQ(dw, dw1) << threads << " threads";
  }
  omp_set_num_threads(threads_before);
}

}  // namespace
