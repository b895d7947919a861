// The fixed-order row reductions (row_reduce.h): lane j of kLanes takes
// elements j, j + kLanes, ... in order, the lanes are summed 0 to kLanes - 1,
// then the tail, whatever registers hold the lanes (16, 32 or 64 bytes: all
// three are checked on any machine). Checked bit for bit
// against that order written with scalars (the products of row_dot_wide are
// exact in double, so an fma there changes nothing; row_dot's float products
// are not, so it is checked to rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/row_reduce.h"

namespace {

using kvs::cpu::detail::kLanes;

std::vector<float> row_of(int n, int seed) {
  std::vector<float> x(n);
  for (int s = 0; s < n; ++s) {
    const int k = (s * 37 + seed * 11) % 101;
    x[s] = std::ldexp(0.5f + 0.004f * (float)k, (k % 23) - 11) * (k % 3 == 0 ? -1.0f : 1.0f);
  }
  return x;
}

template <class Acc> Acc lane_order_sum(const std::vector<float>& a, const std::vector<float>* b) {
  const int n = (int)a.size();
  Acc part[kLanes] = {};
  int s = 0;
  for (; s + kLanes <= n; s += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += b ? (Acc)a[s + j] * (Acc)(*b)[s + j] : (Acc)a[s + j];
  Acc sum = 0;
  for (int j = 0; j < kLanes; ++j) sum += part[j];
  for (; s < n; ++s) sum += b ? (Acc)a[s] * (Acc)(*b)[s] : (Acc)a[s];
  return sum;
}

// Registers of B bytes (16: SSE, 32: AVX, 64: AVX-512; all compile everywhere).
template <int B> void expect_lane_order(int n) {
  using namespace kvs::cpu::detail;
  const std::vector<float> a = row_of(n, 1), b = row_of(n, 2);
  const double sum_d = row_sum<float, double, B>(a.data(), n);
  ASSERT_EQ(std::bit_cast<uint64_t>(sum_d), std::bit_cast<uint64_t>(lane_order_sum<double>(a, nullptr))) << n;
  const float sum_f = row_sum<float, float, B>(a.data(), n);
  ASSERT_EQ(std::bit_cast<uint32_t>(sum_f), std::bit_cast<uint32_t>(lane_order_sum<float>(a, nullptr))) << n;
  const double dot_d = row_dot_wide<double, float, B>(a.data(), b.data(), (size_t)n);
  ASSERT_EQ(std::bit_cast<uint64_t>(dot_d), std::bit_cast<uint64_t>(lane_order_sum<double>(a, &b))) << n;
  const float dot_f = row_dot<float, B>(a.data(), b.data(), n);
  const double dot_ref = lane_order_sum<double>(a, &b);
  ASSERT_NEAR(dot_f, dot_ref, 1e-5 * std::fabs(dot_ref) + 1e-30) << n;
  ASSERT_EQ((row_max<float, B>(a.data(), n)), *std::max_element(a.begin(), a.end())) << n;
}

TEST(OpsRowReduce, EveryReductionKeepsTheLaneOrderBitForBitInAnyRegisterWidth) {
  for (int n = 1; n <= 3 * kLanes + 5; ++n) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_lane_order<16>(n);
    expect_lane_order<32>(n);
    expect_lane_order<64>(n);
  }
}

// The maximum's position does not matter: in any lane, in the tail, first or last.
TEST(OpsRowReduce, RowMaxFindsTheMaximumAnywhere) {
  const int n = 2 * kLanes + 3;
  for (int at = 0; at < n; ++at) {
    std::vector<float> x(n, -1.0f);
    x[at] = 2.5f;
    ASSERT_EQ(kvs::cpu::detail::row_max(x.data(), n), 2.5f) << "maximum at " << at;
  }
}

}  // namespace
