#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

// Known values, so a change to any formula of core/rng.h shows (comparing a function with itself cannot). They
// come from an independent Python transcription of rng.h (64-bit wrap-around by `& (2**64 - 1)`, math.log and
// math.cos for Box-Muller):
//   def splitmix64(x):
//     x = (x + 0x9E3779B97F4A7C15) & M; x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
//     x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M; return x ^ (x >> 31)
//   uniform01(s, i) = (splitmix64((s + splitmix64(i)) & M) >> 11) / 2**53
//   normal01(s, i) = sqrt(-2 log(max(uniform01(s, 2i), 1e-300))) * cos(6.283185307179586 * uniform01(s, 2i + 1))
// splitmix64(0) = 0xE220A8397B1DCDAF is also the published first output of SplitMix64 seeded with 0.
TEST(Rng, KnownValues) {
  EXPECT_EQ(kvs::splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(kvs::splitmix64(1), 0x910A2DEC89025CC1ull);
  EXPECT_EQ(kvs::splitmix64(~0ull), 0xE4D971771B652C20ull);
  // 53-bit integers times 2^-53: exact in doubles.
  EXPECT_EQ(kvs::uniform01(0, 0), 0.6524484863740322);
  EXPECT_EQ(kvs::uniform01(7, 123), 0.015799222668748114);
  EXPECT_EQ(kvs::uniform01(42, uint64_t(1) << 40), 0.9706944798659632);
  // log and cos may differ in the last bit between libms.
  EXPECT_NEAR(kvs::normal01(99, 0), -0.6729644197621266, 1e-14);
  EXPECT_NEAR(kvs::normal01(99, 1), 0.4776500347975506, 1e-14);
  EXPECT_NEAR(kvs::normal01(5, 1000000), -0.7936914145778042, 1e-14);
  // CounterRng: value c of the stream is splitmix64(seed + splitmix64(c)), wherever the counter starts.
  kvs::CounterRng a{42, 0}, b{42, 1000};
  EXPECT_EQ(a.next_u64(), 0xFE554343B462A664ull);
  EXPECT_EQ(a.next_u64(), 0x7EB3B394AC9EFC29ull);
  EXPECT_EQ(a.counter, 2u);
  EXPECT_EQ(b.next_u64(), 0x54C38B9C7001E1E9ull);
  kvs::CounterRng c{42, 1};
  EXPECT_EQ(c.next_below(1000), 0x7EB3B394AC9EFC29ull % 1000);
}

// Value i of a stream depends on both the seed and i; CounterRng walks the same stream as uniform01.
TEST(Rng, CounterStreamsArePureFunctions) {
  EXPECT_NE(kvs::uniform01(7, 123), kvs::uniform01(8, 123));
  EXPECT_NE(kvs::uniform01(7, 123), kvs::uniform01(7, 124));
  kvs::CounterRng a{42, 0};
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(a.next_uniform(), kvs::uniform01(42, i)) << i;
}

TEST(Rng, NormalHasUnitMoments) {
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    double x = kvs::normal01(99, i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

namespace {

double lag1_correlation(const std::vector<double>& x) {
  const size_t n = x.size() - 1;
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += x[i], mb += x[i + 1];
  ma /= n, mb /= n;
  double c = 0, va = 0, vb = 0;
  for (size_t i = 0; i < n; ++i) {
    c += (x[i] - ma) * (x[i + 1] - mb);
    va += (x[i] - ma) * (x[i] - ma);
    vb += (x[i + 1] - mb) * (x[i + 1] - mb);
  }
  return c / std::sqrt(va * vb);
}

}  // namespace

// Consecutive normals must not share a uniform. If draw i's angle reused draw i+1's radius uniform (u2 =
// uniform01(seed, 2i + 2)), the plain lag-1 correlation would stay near 0 (the cosine of a uniform averages out),
// but that of the squares is about 0.06 (E[cos^2(2 pi u) * -2 log u] = 1 + Si(4 pi) / (4 pi)); with 100k draws
// the noise on either is about 0.003.
TEST(Rng, ConsecutiveNormalsAreUncorrelated) {
  std::vector<double> x(100001), sq(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = kvs::normal01(3, i), sq[i] = x[i] * x[i];
  EXPECT_LT(std::abs(lag1_correlation(x)), 0.01);
  EXPECT_LT(std::abs(lag1_correlation(sq)), 0.02);
}
