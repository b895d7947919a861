// core/cpu_steal.h: the "cpu" line of /proc/stat parsed, and the steal
// fraction over an interval.
#include "core/cpu_steal.h"

#include <gtest/gtest.h>

namespace {

TEST(CpuSteal, ParsesTheAggregateLineAndIgnoresPerCpuLines) {
  const std::string text =
      "cpu0 1 2 3 4 5 6 7 8 0 0\n"
      "cpu  8277896 10153 1977376 5269498 67364 0 26695 192725 900 0\n"
      "cpu1 4491223 5282 1082111 2162890 51480 0 24409 96645 0 0\n"
      "intr 123\n";
  const auto t = kvs::parse_cpu_times(text);
  ASSERT_TRUE(t.has_value());
  // user..steal, not guest (already counted in user).
  EXPECT_EQ(t->total, 8277896ull + 10153 + 1977376 + 5269498 + 67364 + 0 + 26695 + 192725);
  EXPECT_EQ(t->steal, 192725ull);
}

TEST(CpuSteal, OldKernelsWithoutTheStealColumnReadZero) {
  const auto t = kvs::parse_cpu_times("cpu  100 0 50 850 0 0 0\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->total, 1000ull);
  EXPECT_EQ(t->steal, 0ull);
}

TEST(CpuSteal, NoAggregateLineIsNothing) {
  EXPECT_FALSE(kvs::parse_cpu_times("cpu0 1 2 3 4\nintr 5\n").has_value());
  EXPECT_FALSE(kvs::parse_cpu_times("cpu  1 2\n").has_value());
  EXPECT_FALSE(kvs::parse_cpu_times("").has_value());
}

TEST(CpuSteal, FractionOverAnInterval) {
  const kvs::CpuTimes a{1000, 10}, b{1400, 30};
  EXPECT_DOUBLE_EQ(kvs::steal_fraction(a, b), 20.0 / 400.0);
  EXPECT_DOUBLE_EQ(kvs::steal_fraction(a, a), 0.0);  // no time passed
  EXPECT_DOUBLE_EQ(kvs::steal_fraction(b, a), 0.0);  // out of order: nothing sensible
}

TEST(CpuSteal, ThisMachineCanBeRead) {
  const auto t = kvs::read_cpu_times();
#ifdef __linux__
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->total, 0ull);
  EXPECT_LE(t->steal, t->total);
#else
  (void)t;
#endif
}

}  // namespace
