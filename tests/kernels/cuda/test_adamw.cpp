// The multi-tensor AdamW step (kernels/cuda/adamw.cu) against a host loop
// that repeats CpuEngine::adamw_step's float arithmetic. The same float
// operations run in the same order; differences come only from the per-step
// constants (rounded from float arguments rather than double) and possible FMA
// contraction by the host compiler, so a few fp32 ulps; the bf16 copy must be
// exactly bf16(master).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;

struct HostTensor {
  size_t offset, numel;
  bool decay, clamp01;
};
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  long step;
};

// CpuEngine::adamw_step, operation for operation, over the flat buffers.
void host_adamw(FVec& params, const FVec& grads, FVec& exp_avg, FVec& exp_avg_sq,
                const std::vector<HostTensor>& tensors, const Hyper& hp) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float lr = static_cast<float>(hp.lr), eps = static_cast<float>(hp.eps);
  const float scale = static_cast<float>(hp.grad_scale);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  for (const HostTensor& t : tensors) {
    const float decay = t.decay ? 1.0f - lr * static_cast<float>(hp.weight_decay) : 1.0f;
    float* p = params.data() + t.offset;
    const float* g = grads.data() + t.offset;
    float* m = exp_avg.data() + t.offset;
    float* v = exp_avg_sq.data() + t.offset;
    for (size_t i = 0; i < t.numel; ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * m[i] / denom;
    }
    if (t.clamp01)
      for (size_t i = 0; i < t.numel; ++i) p[i] = std::clamp(p[i], 0.0f, 1.0f);
  }
}

// Five steps over tensors with and without decay and clamp01, one of them
// spanning two chunks, with gaps between tensors that no chunk covers (they
// must stay untouched). Master weights, both moments and the bf16 copy.
TEST(CudaAdamW, MatchesCpuEngineStepForStep) {
  KVS_REQUIRE_GPU();
  const std::vector<HostTensor> tensors = {
      {0, 1000, true, false},
      {1024, 70000, true, false},  // > kAdamWChunkElems: two chunks
      {71040, 37, false, false},
      {71104, 300, false, true},   // clamp01, no decay (shift coefficients)
      {71424, 129, true, true},    // clamp01 and decay
      {71562, 33, true, false},    // starts and ends off a 4-element boundary (vector loads: 2 + 28 + 3)
      {71597, 2, false, true},     // inside one 4-element group: no vector part
  };
  const size_t total = 71600;
  std::vector<bool> covered(total, false);
  std::vector<kc::AdamWChunk> chunks;
  for (const HostTensor& t : tensors) {
    const uint32_t flags = (t.decay ? kc::kAdamWDecay : 0u) | (t.clamp01 ? kc::kAdamWClamp01 : 0u);
    for (size_t b = t.offset; b < t.offset + t.numel; b += kc::kAdamWChunkElems)
      chunks.push_back({b, std::min<uint64_t>(b + kc::kAdamWChunkElems, t.offset + t.numel), flags});
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) covered[i] = true;
  }
  ASSERT_EQ(chunks.size(), 8u);

  std::mt19937_64 g(101);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  FVec params(total, 7.0f), exp_avg(total, 0.0f), exp_avg_sq(total, 0.0f);
  for (const HostTensor& t : tensors)
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) params[i] = t.clamp01 ? 0.5f + 0.6f * nd(g) : 0.5f * nd(g);

  DeviceBuffer<float> d_params(params), d_m(exp_avg), d_v(exp_avg_sq), d_grads(total);
  DeviceBuffer<bf16> d_bf16(total);  // poisoned: the gaps must stay so
  DeviceBuffer<kc::AdamWChunk> d_chunks(chunks);

  Hyper hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, 0};
  for (int step = 1; step <= 5; ++step) {
    hp.step = step;
    FVec grads(total);
    for (auto& x : grads) x = nd(g);
    d_grads.upload(grads);
    kc::AdamWArgs a;
    a.lr = static_cast<float>(hp.lr);
    a.beta1 = static_cast<float>(hp.beta1);
    a.beta2 = static_cast<float>(hp.beta2);
    a.eps = static_cast<float>(hp.eps);
    a.weight_decay = static_cast<float>(hp.weight_decay);
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(hp.beta1, double(step)));
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(hp.beta2, double(step)));
    a.grad_scale = static_cast<float>(hp.grad_scale);
    kc::adamw_step(d_params.get(), d_bf16.get(), d_grads.get(), d_m.get(), d_v.get(), d_chunks.get(),
                   int(chunks.size()), a, nullptr);
    host_adamw(params, grads, exp_avg, exp_avg_sq, tensors, hp);

    const FVec got_p = d_params.download(), got_m = d_m.download(), got_v = d_v.download();
    const std::vector<bf16> got_bf16 = d_bf16.download();
    EXPECT_TRUE(all_close(got_p, params, 0.0, 2e-6)) << "master, step " << step;
    EXPECT_TRUE(all_close(got_m, exp_avg, 1e-5, 1e-9)) << "exp_avg, step " << step;
    EXPECT_TRUE(all_close(got_v, exp_avg_sq, 1e-5, 1e-12)) << "exp_avg_sq, step " << step;
    size_t bad_copy = 0, gap_touched = 0;
    for (size_t i = 0; i < total; ++i) {
      if (covered[i])
        bad_copy += bits(got_bf16[i]) != bits(__float2bfloat16_rn(got_p[i]));
      else
        gap_touched += got_p[i] != 7.0f || got_m[i] != 0.0f || got_v[i] != 0.0f || bits(got_bf16[i]) != 0xFFFF;
    }
    EXPECT_EQ(bad_copy, 0u) << "bf16 copy != bf16(master), step " << step;
    EXPECT_EQ(gap_touched, 0u) << "elements outside every chunk changed, step " << step;
  }
  // The clamp was exercised: some clamp01 coefficients sit exactly on the box.
  size_t on_box = 0;
  for (const HostTensor& t : tensors)
    if (t.clamp01)
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) on_box += params[i] == 0.0f || params[i] == 1.0f;
  EXPECT_GT(on_box, 0u);
}

// No chunks: nothing to do, nothing launched.
TEST(CudaAdamW, EmptyTableIsANoOp) {
  KVS_REQUIRE_GPU();
  DeviceBuffer<float> d_p(FVec(4, 1.0f));
  kc::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f};
  kc::adamw_step(d_p.get(), nullptr, nullptr, nullptr, nullptr, nullptr, 0, a, nullptr);
  EXPECT_EQ(d_p.download(), FVec(4, 1.0f));
}

}  // namespace
#endif  // KVS_CUDA
