// SwiGLU on the fused gate/up projection (kernels/cuda/swiglu.cu), forward and
// backward,
// against the CPU reference op run in double on the same bf16-rounded inputs
// (bf16 outputs: kBf16Rtol/kBf16Atol, cuda_test_util.h). Outputs start
// poisoned (NaN), so an element the kernel forgets shows up.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;
using DVec = std::vector<double>;

struct RowShape {
  int N, C;
};

const RowShape kSwigluShapes[] = {{1, 1}, {3, 13}, {8, 64}, {5, 1000}, {2, 4104}};

TEST(CudaSwiGLU, ForwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kSwigluShapes) {
    SCOPED_TRACE(testing::Message() << "N " << s.N << " F " << s.C);
    const int N = s.N, F = s.C;
    const FVec gu = random_bf16_values((size_t)N * 2 * F, 100 + F, 2.0f);
    DVec want((size_t)N * F);
    kvs::cpu::swiglu_forward<double>(want.data(), to_double(gu).data(), N, F);
    DeviceBuffer<bf16> d_gu(to_bf16(gu)), d_out((size_t)N * F);
    kc::swiglu_forward(d_out.get(), d_gu.get(), N, F, 0);
    EXPECT_TRUE(all_close(download_f32(d_out), to_float(want), kBf16Rtol, kBf16Atol));
  }
}

TEST(CudaSwiGLU, BackwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kSwigluShapes) {
    SCOPED_TRACE(testing::Message() << "N " << s.N << " F " << s.C);
    const int N = s.N, F = s.C;
    const FVec gu = random_bf16_values((size_t)N * 2 * F, 110 + F, 2.0f);
    const FVec dout = random_bf16_values((size_t)N * F, 120 + F);
    DVec dgu((size_t)N * 2 * F, 0.0);
    kvs::cpu::swiglu_backward<double>(dgu.data(), to_double(dout).data(), to_double(gu).data(), N, F);
    const FVec want = to_float(dgu);
    DeviceBuffer<bf16> d_gu(to_bf16(gu)), d_dout(to_bf16(dout)), d_dgu((size_t)N * 2 * F);
    kc::swiglu_backward(d_dgu.get(), d_dout.get(), d_gu.get(), N, F, 0);
    EXPECT_TRUE(all_close(download_f32(d_dgu), want, kBf16Rtol, kBf16Atol));
  }
}

}  // namespace
#endif  // KVS_CUDA
