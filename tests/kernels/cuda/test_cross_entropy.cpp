// The fused CUDA cross-entropy (kernels/cuda/cross_entropy.cu) against
// kvs::cpu::cross_entropy_forward_backward run in double on the same
// bf16-rounded logits: token losses (fp32: sum of exp in fp32 over V terms,
// 2e-5 absolute + 1e-5 relative), dlogits (bf16: one bf16 ulp relative) and
// argmax (exact, first maximum). Outputs start poisoned (NaN).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using DVec = std::vector<double>;
using FVec = std::vector<float>;

struct CeCase {
  int N, V;
  bool use_mask, in_place;
  float logit_scale;
};
std::ostream& operator<<(std::ostream& os, const CeCase& c) {
  return os << "N=" << c.N << " V=" << c.V << " mask=" << c.use_mask << " in_place=" << c.in_place
            << " logit_scale=" << c.logit_scale;
}

class CudaCrossEntropy : public ::testing::TestWithParam<CeCase> {};

// losses, dlogits and argmax against kvs::cpu::cross_entropy_forward_backward
// in double. Masked rows (mask 0) carry target -1, which must never be read;
// one row has mask 0.5.
TEST_P(CudaCrossEntropy, MatchesCpu) {
  KVS_REQUIRE_GPU();
  const auto [N, V, use_mask, in_place, logit_scale] = GetParam();
  const FVec logits = random_bf16_values(size_t(N) * V, 71 + V, logit_scale);
  std::mt19937_64 g(72);
  std::vector<int32_t> targets(N);
  FVec mask(N, 1.0f);
  int active = 0;
  for (int n = 0; n < N; ++n) {
    targets[n] = int32_t(g() % uint64_t(V));
    if (use_mask) {
      if (n % 3 == 1) mask[n] = 0.0f;
      if (n == 2) mask[n] = 0.5f;
      if (mask[n] == 0.0f) targets[n] = -1;
    }
    active += mask[n] != 0.0f;
  }
  const float grad_scale = 1.0f / float(std::max(active, 1));

  DeviceBuffer<bf16> d_logits(to_bf16(logits));
  DeviceBuffer<bf16> d_dlogits_separate(in_place ? 0 : size_t(N) * V);
  bf16* d_dlogits = in_place ? d_logits.get() : d_dlogits_separate.get();
  DeviceBuffer<int32_t> d_targets(targets), d_argmax(N);
  DeviceBuffer<float> d_mask(mask), d_losses(N);
  kc::cross_entropy_forward_backward(d_losses.get(), d_dlogits, d_argmax.get(), d_logits.get(), d_targets.get(),
                                     use_mask ? d_mask.get() : nullptr, N, V, grad_scale, nullptr);
  const FVec losses = d_losses.download();
  const FVec dlogits = to_f32(in_place ? d_logits.download() : d_dlogits_separate.download());
  const std::vector<int32_t> argmax = d_argmax.download();

  const DVec x(logits.begin(), logits.end());
  DVec want_losses(N), want_dlogits(size_t(N) * V);
  std::vector<int32_t> want_argmax(N);
  kvs::cpu::cross_entropy_forward_backward<double>(want_losses.data(), want_dlogits.data(), want_argmax.data(),
                                                   x.data(), targets.data(), use_mask ? mask.data() : nullptr, N, V,
                                                   grad_scale);
  EXPECT_TRUE(close_scaled(losses, want_losses, DVec(N, 0.0), 1e-5, 2e-5, 0.0));
  EXPECT_TRUE(close_scaled(dlogits, want_dlogits, DVec(dlogits.size(), 0.0), 1.0 / 256, 1e-6 * grad_scale, 0.0));
  EXPECT_EQ(argmax, want_argmax);
  for (int n = 0; n < N; ++n) {
    if (mask[n] != 0.0f) continue;
    EXPECT_EQ(losses[n], 0.0f) << "masked row " << n;
    for (int v = 0; v < V; ++v) ASSERT_EQ(dlogits[size_t(n) * V + v], 0.0f) << "masked row " << n << ", col " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(, CudaCrossEntropy,
                         ::testing::Values(CeCase{8, 32000, true, false, 2.0f},   // vocabulary-sized, 16-byte path
                                           CeCase{8, 32000, true, true, 2.0f},    // in place
                                           CeCase{6, 32000, false, true, 8.0f},   // peaked softmax, no mask
                                           CeCase{33, 37, true, false, 1.0f},     // odd V: element-wise path
                                           CeCase{33, 37, true, true, 1.0f},
                                           CeCase{64, 256, true, true, 3.0f},
                                           CeCase{7, 1000, false, false, 0.5f},
                                           CeCase{5, 1, true, false, 1.0f},       // V = 1: loss 0, gradient 0
                                           CeCase{3, 2056, true, true, 4.0f}));   // V % 8 == 0, not a warp multiple

// argmax is the FIRST maximum: ties are resolved towards the smaller index,
// including ties across threads and at the very end of the row.
TEST(CudaCrossEntropyArgmax, FirstMaximumWins) {
  KVS_REQUIRE_GPU();
  const int N = 5, V = 4096;
  FVec logits(size_t(N) * V, 0.0f);
  for (int v = 0; v < V; ++v) logits[v] = 1.0f;                          // row 0: all equal -> 0
  logits[size_t(1) * V + 3000] = 2.0f, logits[size_t(1) * V + 1500] = 2.0f;  // row 1: -> 1500
  logits[size_t(2) * V + V - 1] = 5.0f;                                 // row 2: last -> V-1
  logits[size_t(3) * V + 5] = 3.0f, logits[size_t(3) * V + 6] = 3.0f;   // row 3: one thread's pack -> 5
  logits[size_t(4) * V + 8] = -1.0f;                                    // row 4: zeros, one lower -> 0
  std::vector<int32_t> targets(N, 0);
  DeviceBuffer<bf16> d_logits(to_bf16(logits));
  DeviceBuffer<int32_t> d_targets(targets), d_argmax(N);
  DeviceBuffer<float> d_losses(N);
  // Only losses and argmax: dlogits null.
  kc::cross_entropy_forward_backward(d_losses.get(), nullptr, d_argmax.get(), d_logits.get(), d_targets.get(), nullptr,
                                     N, V, 1.0f, nullptr);
  EXPECT_EQ(d_argmax.download(), (std::vector<int32_t>{0, 1500, V - 1, 5, 0}));
  const FVec losses = d_losses.download();
  EXPECT_NEAR(losses[0], std::log(double(V)), 1e-5);
}

// A fully masked batch with argmax wanted: argmax still computed, nothing else read.
TEST(CudaCrossEntropyArgmax, MaskedRowsStillGetArgmax) {
  KVS_REQUIRE_GPU();
  const int N = 4, V = 100;
  const FVec logits = random_bf16_values(size_t(N) * V, 81);
  std::vector<int32_t> targets(N, -1);
  DeviceBuffer<bf16> d_logits(to_bf16(logits));
  DeviceBuffer<int32_t> d_targets(targets), d_argmax(N);
  DeviceBuffer<float> d_mask(FVec(N, 0.0f)), d_losses(N);
  kc::cross_entropy_forward_backward(d_losses.get(), d_logits.get(), d_argmax.get(), d_logits.get(), d_targets.get(),
                                     d_mask.get(), N, V, 1.0f, nullptr);
  const std::vector<int32_t> argmax = d_argmax.download();
  for (int n = 0; n < N; ++n) {
    const auto row = logits.begin() + size_t(n) * V;
    EXPECT_EQ(argmax[n], int(std::max_element(row, row + V) - row));
  }
  for (float l : d_losses.download()) EXPECT_EQ(l, 0.0f);
  for (bf16 d : d_logits.download()) ASSERT_EQ(__bfloat162float(d), 0.0f);
}

}  // namespace
#endif  // KVS_CUDA
