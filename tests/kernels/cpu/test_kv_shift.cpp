// CPU KV shift: the forward against the direct formula, the backward against
// finite differences, float vs double and the += convention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

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

}  // namespace
