// CPU residual add: the sum, aliasing, float vs double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/residual.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

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

}  // namespace
