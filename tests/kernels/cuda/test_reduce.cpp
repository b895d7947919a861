// The deterministic fp64 sums (kernels/cuda/reduce.cu) against a double host
// sum: within 1e-11 relative to sum |x_i| (the order differs from the host's),
// and the same bits on a second call.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;

class CudaReduce : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaReduce, SumAndSumSquaresMatchHostAndRepeatBitwise) {
  KVS_REQUIRE_GPU();
  const size_t n = GetParam();
  std::mt19937_64 g(91 + n);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  FVec x(n);
  for (auto& v : x) v = nd(g);
  double sum = 0, sum_abs = 0, sum_sq = 0;
  for (float v : x) {
    sum += v;
    sum_abs += std::fabs(double(v));
    sum_sq += double(v) * v;
  }

  DeviceBuffer<float> d_x(n);
  if (n) d_x.upload(x);
  DeviceBuffer<double> d_scratch(kc::sum_scratch_doubles(n)), d_out(2);
  double first[2] = {0, 0};
  for (int rep = 0; rep < 2; ++rep) {
    d_out.poison();
    d_scratch.poison();
    kc::sum_f32(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
    kc::sum_squares_f32(d_out.get() + 1, d_x.get(), n, d_scratch.get(), nullptr);
    const std::vector<double> out = d_out.download();
    EXPECT_NEAR(out[0], sum, 1e-11 * sum_abs + 1e-300) << "n = " << n;
    EXPECT_NEAR(out[1], sum_sq, 1e-11 * sum_sq + 1e-300) << "n = " << n;
    if (rep == 0) {
      first[0] = out[0], first[1] = out[1];
    } else {  // the same bits
      EXPECT_EQ(std::memcmp(&first[0], &out[0], sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(&first[1], &out[1], sizeof(double)), 0);
    }
  }
}

// Sizes: empty; one element; one block; 257 blocks with a partial last one; and past the 1024-block
// cap (reduce.cu's sum_blocks: 4096 elements a block), where each thread's grid-stride loop runs five
// unrolled rounds and three threads take one more element.
INSTANTIATE_TEST_SUITE_P(, CudaReduce,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{1000}, size_t{262144 * 4 + 5},
                                           size_t{262144 * 20 + 3}));

}  // namespace
#endif  // KVS_CUDA
