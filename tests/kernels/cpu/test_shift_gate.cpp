// CPU sigmoid gate of the KV shift: the forward against the formula, the
// backward against finite differences through the effective coefficients,
// column 0 untouched, the += convention, float vs double.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops_test_util.h"
#include "kernels/cpu/shift_gate.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsShiftGate, ForwardIsOneMinusSigmoidAndSigmoid) {
  const int H = 5;
  Vec stored = randn((size_t)H * 2, 1000, 3.0), eff((size_t)H * 2, std::nan(""));
  stored[1] = 0.0;  // sigmoid(0) = 1/2
  shift_gate_forward(eff.data(), stored.data(), H);
  EXPECT_EQ(eff[0], 0.5);
  EXPECT_EQ(eff[1], 0.5);
  for (int h = 0; h < H; ++h) {
    const double s = 1.0 / (1.0 + std::exp(-stored[h * 2 + 1]));
    EXPECT_NEAR(eff[h * 2 + 1], s, 1e-15);
    EXPECT_NEAR(eff[h * 2 + 0], 1.0 - s, 1e-15);
  }
  // Column 0 of the stored tensor is not read.
  Vec other = stored, eff2(eff.size());
  for (int h = 0; h < H; ++h) other[h * 2 + 0] = 1e9;
  shift_gate_forward(eff2.data(), other.data(), H);
  EXPECT_EQ(eff2, eff);
}

TEST(OpsShiftGate, BackwardMatchesFiniteDifferences) {
  const int H = 4;
  Vec stored = randn((size_t)H * 2, 1010, 1.5), R = randn((size_t)H * 2, 1011), eff((size_t)H * 2);
  auto f = [&] {
    shift_gate_forward(eff.data(), stored.data(), H);
    return dot(eff, R);
  };
  Vec fresh(stored.size(), 0.0);
  shift_gate_backward(fresh.data(), R.data(), stored.data(), H);
  const Vec num = numgrad(stored, f);
  expect_grad_close(fresh, num, "dstored");
  for (int h = 0; h < H; ++h) EXPECT_EQ(fresh[h * 2 + 0], 0.0) << "column 0 gets nothing";

  Vec g0 = randn(stored.size(), 1012), g = g0;
  shift_gate_backward(g.data(), R.data(), stored.data(), H);
  EXPECT_LT(rel_err(g, add(g0, fresh)), 1e-14) << "backward must accumulate";

  FVec sf = to_float(stored), Rf = to_float(R), ef(eff.size()), gf(stored.size(), 0.f);
  f();
  shift_gate_forward(ef.data(), sf.data(), H);
  shift_gate_backward(gf.data(), Rf.data(), sf.data(), H);
  EXPECT_LT(rel_err(to_double(ef), eff), kFloatTol);
  EXPECT_LT(rel_err(to_double(gf), fresh), kFloatTol);
}

}  // namespace
