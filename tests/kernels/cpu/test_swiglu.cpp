// CPU SwiGLU on the fused gate_up [N, 2F]: the forward against the formula,
// the backward against finite differences, for widths with and without a
// tail after the eight- and sixteen-float groups (F = 13, 16, 21, 45: all
// three widths in one row) and one row.
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

struct Shape {
  size_t N, F;
};
const Shape kShapes[] = {{3, 13}, {4, 16}, {1, 21}, {2, 45}};

TEST(OpsSwiglu, ForwardAndBackward) {
  for (const auto [N, F] : kShapes) {
    SCOPED_TRACE(testing::Message() << "N " << N << " F " << F);
    const size_t n = N * F;
    Vec gu = randn(2 * n, 700 + F, 3.0), R = randn(n, 702), out(n);
    gu[0] = -120.0;  // far tail: silu -> 0 without overflow trouble
    swiglu_forward(out.data(), gu.data(), N, F);
    for (size_t r = 0; r < N; ++r)
      for (size_t j = 0; j < F; ++j) {
        const double g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
        EXPECT_NEAR(out[r * F + j], g / (1.0 + std::exp(-g)) * u, 1e-14) << r << "," << j;
      }
    auto f = [&] {
      swiglu_forward(out.data(), gu.data(), N, F);
      return dot(out, R);
    };
    Vec dgu0 = randn(2 * n, 703), dgu = dgu0, dguf(2 * n, 0.0);
    swiglu_backward(dguf.data(), R.data(), gu.data(), N, F);
    swiglu_backward(dgu.data(), R.data(), gu.data(), N, F);
    expect_grad_close(dguf, numgrad(gu, f), "dgate_up");
    EXPECT_LT(rel_err(dgu, add(dgu0, dguf)), 1e-14);

    FVec guf = to_float(gu), Rf = to_float(R), of(n), dgff(2 * n, 0.f);
    f();
    swiglu_forward(of.data(), guf.data(), N, F);
    swiglu_backward(dgff.data(), Rf.data(), guf.data(), N, F);
    EXPECT_LT(rel_err(to_double(of), out), kFloatTol);
    EXPECT_LT(rel_err(to_double(dgff), dguf), kFloatTol);
    swiglu_backward(dgff.data(), Rf.data(), guf.data(), N, F);  // the eight-lane path adds too
    EXPECT_LT(rel_err(to_double(dgff), add(dguf, dguf)), kFloatTol);
  }
}

// overwrite: the gradient is written, not added: whatever the buffer held
// (NaN here), the values of adding into zeros, in both lane widths' tails.
TEST(OpsSwiglu, OverwritingEqualsAddingIntoZeros) {
  for (const auto [N, F] : kShapes) {
    const size_t n = N * F;
    FVec gu = to_float(randn(2 * n, 710 + F, 3.0)), R = to_float(randn(n, 712));
    FVec add(2 * n, 0.f), over(2 * n, std::nanf(""));
    swiglu_backward(add.data(), R.data(), gu.data(), N, F);
    swiglu_backward(over.data(), R.data(), gu.data(), N, F, /*overwrite=*/true);
    EXPECT_EQ(over, add) << N << "x" << F;
  }
}

}  // namespace
