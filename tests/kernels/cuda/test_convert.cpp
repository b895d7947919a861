// fp32 <-> bf16 conversion, fills and add_f32 (kernels/cuda/convert.cu): the rounding is
// the host's round-to-nearest-even bit for bit, bf16 -> fp32 is exact, and
// nothing outside the range is written (the poison stays).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;

TEST(CudaConvert, F32ToBf16RoundsLikeTheHostAndBf16ToF32IsExact) {
  KVS_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{1000}, size_t{4099}}) {
    for (int offset : {0, 1}) {  // offset 1: unaligned pointers take the scalar path
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      FVec x = random_uniform(n, 11 + n, -3.0f, 3.0f);  // not bf16-representable
      if (n >= 4) x[1] = 1e-30f, x[2] = -0.0f, x[3] = 3.0e38f;
      DeviceBuffer<float> in(n + 1), back(n + 1);
      DeviceBuffer<bf16> mid(n + 1);
      std::vector<float> padded(n + 1, 0.0f);
      std::copy(x.begin(), x.end(), padded.begin() + offset);
      in.upload(padded);
      kc::f32_to_bf16(mid.get() + offset, in.get() + offset, n, 0);
      kc::bf16_to_f32(back.get() + offset, mid.get() + offset, n, 0);
      const auto got_mid = mid.download();
      const auto got_back = back.download();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(got_mid[i + offset]), bits(__float2bfloat16_rn(x[i]))) << "element " << i;
        ASSERT_EQ(got_back[i + offset], bf16_round(x[i])) << "element " << i;
      }
      // Nothing written outside [offset, offset + n): the poison is intact.
      const size_t outside = offset ? 0 : n;
      EXPECT_EQ(bits(got_mid[outside]), 0xFFFF);
    }
  }
}

TEST(CudaConvert, FillWritesEveryElement) {
  KVS_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{9}, size_t{100003}}) {
    DeviceBuffer<float> f(n);
    DeviceBuffer<bf16> h(n);
    kc::fill_f32(f.get(), 1.5f, n, 0);
    kc::fill_bf16(h.get(), 0.1f, n, 0);
    const auto gf = f.download();
    const auto gh = h.download();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(gf[i], 1.5f);
      ASSERT_EQ(bits(gh[i]), bits(__float2bfloat16_rn(0.1f)));
    }
  }
}

// y += x element by element, the fp32 sum of the host (one add: exact same bits),
// and nothing past n written.
TEST(CudaConvert, AddF32AddsEveryElement) {
  KVS_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{9}, size_t{100003}}) {
    const FVec x = random_uniform(n, 21 + n, -2.0f, 2.0f);
    FVec y = random_uniform(n + 1, 31 + n, -2.0f, 2.0f);
    DeviceBuffer<float> dx(n), dy(n + 1);
    dx.upload(x);
    dy.upload(y);
    kc::add_f32(dy.get(), dx.get(), n, 0);
    const auto got = dy.download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], y[i] + x[i]) << "element " << i;
    ASSERT_EQ(got[n], y[n]) << "wrote past n";
  }
}

// y += float(x) for bf16 x: the host's fp32 add of the widened value, bit for bit.
TEST(CudaConvert, AddBf16ToF32WidensAndAdds) {
  KVS_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{9}, size_t{100003}}) {
    const FVec x = random_bf16_values(n, 41 + n);
    FVec y = random_uniform(n + 1, 51 + n, -2.0f, 2.0f);
    DeviceBuffer<bf16> dx(to_bf16(x));
    DeviceBuffer<float> dy(y);
    kc::add_bf16_to_f32(dy.get(), dx.get(), n, 0);
    const auto got = dy.download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], y[i] + x[i]) << "element " << i;
    ASSERT_EQ(got[n], y[n]) << "wrote past n";
  }
}

}  // namespace
#endif  // KVS_CUDA
