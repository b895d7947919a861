// CPU SwiGLU: the forward against the formula, the backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

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

// overwrite: the gradients are written, not added: whatever the buffers held
// (NaN here), the values of adding into zeros, in both lane widths' tails.
TEST(OpsSwiglu, OverwritingEqualsAddingIntoZeros) {
  for (size_t n : {size_t{37}, size_t{64}}) {
    FVec g = to_float(randn(n, 710, 3.0)), u = to_float(randn(n, 711)), R = to_float(randn(n, 712));
    FVec dg_add(n, 0.f), du_add(n, 0.f), dg_over(n, std::nanf("")), du_over(n, std::nanf(""));
    swiglu_backward(dg_add.data(), du_add.data(), R.data(), g.data(), u.data(), n);
    swiglu_backward(dg_over.data(), du_over.data(), R.data(), g.data(), u.data(), n, /*overwrite=*/true);
    EXPECT_EQ(dg_over, dg_add) << n;
    EXPECT_EQ(du_over, du_add) << n;
  }
}

}  // namespace
