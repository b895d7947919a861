// The vectorisable float exp used by softmax, cross-entropy and SwiGLU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/exp_fast.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

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
