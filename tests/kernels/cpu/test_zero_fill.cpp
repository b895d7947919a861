// CPU zero_fill: every element of a small buffer (one memset) and of a large
// one (pieces split between the threads, the last one partial) is zero, and
// nothing around it is touched.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kernels/cpu/zero_fill.h"

namespace {

TEST(OpsZeroFill, ZeroesExactlyTheBufferSmallAndLarge) {
  for (size_t n : {size_t{0}, size_t{37}, (size_t{1} << 17) + 12345}) {
    std::vector<float> buf(n + 2, 7.0f);
    kvs::cpu::zero_fill(buf.data() + 1, n);
    EXPECT_EQ(buf.front(), 7.0f) << n;
    EXPECT_EQ(buf.back(), 7.0f) << n;
    size_t nonzero = 0;
    for (size_t i = 1; i <= n; ++i) nonzero += buf[i] != 0.0f;
    EXPECT_EQ(nonzero, 0u) << n;
  }
}

}  // namespace
