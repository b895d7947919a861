// The vectorisable float exp used by softmax, cross-entropy and SwiGLU, and its eight-lane form.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
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

// The eight- and sixteen-lane versions (softmax rows, SwiGLU) compute what
// the scalar one does, lane by lane.
template <class V, int L> void expect_lanes_match_scalar() {
  using kvs::cpu::detail::exp_fast;
  for (int i = 0; i <= 320000 / L; ++i) {
    V x;
    for (int j = 0; j < L; ++j) x[j] = -100.0f + 200.0f * (float)(L * i + j) / 320000.0f;
    const V y = exp_fast(x);
    for (int j = 0; j < L; ++j) ASSERT_EQ(y[j], exp_fast(x[j])) << L << " lanes, x = " << x[j];
  }
}
TEST(OpsExp, VectorExpMatchesScalar) {
  expect_lanes_match_scalar<kvs::cpu::detail::f32x8, 8>();
  expect_lanes_match_scalar<kvs::cpu::detail::f32x16, 16>();
}

TEST(OpsExp, ShiftedSumOverRowsOfAnyLength) {
  for (int n : {0, 1, 7, 8, 9, 31, 64, 100}) {
    std::vector<float> r(n);
    for (int s = 0; s < n; ++s) r[s] = 0.25f * (float)((s * 7) % 13) - 1.0f;
    const std::vector<float> x = r;
    const float sum = kvs::cpu::detail::exp_shifted_sum(r.data(), n, 0.5f);
    double ref = 0;
    for (int s = 0; s < n; ++s) {
      ASSERT_EQ(r[s], kvs::cpu::detail::exp_fast(x[s] - 0.5f)) << "n = " << n << ", s = " << s;
      ref += r[s];
    }
    EXPECT_NEAR(sum, ref, 1e-6 * (1 + ref)) << "n = " << n;
  }
}

// The eight-lane loop (cross-entropy's rows) gives the scalar exp of every element, tail included.
TEST(OpsExp, ShiftedRowIsTheScalarExpOfEveryElement) {
  for (int n = 0; n <= 40; ++n) {
    std::vector<float> x(n), out(n, -1.0f);
    for (int s = 0; s < n; ++s) x[s] = 0.7f * (float)((s * 5) % 17) - 6.0f;
    kvs::cpu::detail::exp_shifted(out.data(), x.data(), n, 0.25f);
    for (int s = 0; s < n; ++s)
      ASSERT_EQ(out[s], kvs::cpu::detail::exp_fast(x[s] - 0.25f)) << "n = " << n << ", s = " << s;
  }
}

// The sixteen lanes in registers of 64 (AVX-512 builds), 32 (AVX) or 16
// bytes: the same values and the same sum, bit for bit, so a softmax row does
// not depend on the machine's vector width.
TEST(OpsExp, ShiftedSumHasTheSameBitsInAnyRegisterWidth) {
  std::vector<float> x(300);
  for (size_t s = 0; s < x.size(); ++s) x[s] = 3.0f * std::sin(0.37f * (float)s) + 0.01f * (float)s;
  for (int n = 0; n <= (int)x.size(); ++n) {
    std::vector<float> r64(x.begin(), x.begin() + n), r32 = r64, r16 = r64;
    const float s64 = kvs::cpu::detail::exp_shifted_sum<64>(r64.data(), n, 1.5f);
    const float s32 = kvs::cpu::detail::exp_shifted_sum<32>(r32.data(), n, 1.5f);
    const float s16 = kvs::cpu::detail::exp_shifted_sum<16>(r16.data(), n, 1.5f);
    ASSERT_EQ(std::bit_cast<uint32_t>(s64), std::bit_cast<uint32_t>(s32)) << "n = " << n;
    ASSERT_EQ(std::bit_cast<uint32_t>(s64), std::bit_cast<uint32_t>(s16)) << "n = " << n;
    ASSERT_EQ(r64, r32) << "n = " << n;
    ASSERT_EQ(r64, r16) << "n = " << n;
  }
}

}  // namespace
