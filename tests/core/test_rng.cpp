#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

TEST(Rng, CounterStreamsArePureFunctions) {
  EXPECT_EQ(kvs::uniform01(7, 123), kvs::uniform01(7, 123));
  EXPECT_NE(kvs::uniform01(7, 123), kvs::uniform01(8, 123));
  kvs::CounterRng a{42, 0}, b{42, 0};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
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
