// SwiGLU and AdamW under the emulator.
// - swiglu_forward_kernel / swiglu_backward_kernel vs kvs::cpu::swiglu_* in
//   double, tests/kernels/cuda/test_swiglu.cpp's shapes and tolerance (bf16:
//   rtol 1e-2, atol 1e-4), both vector widths where V = 8 applies; launches
//   mirror swiglu_forward/backward (256 threads, grid-stride, grid capped).
// - adamw_kernel vs the host loop of tests/kernels/cuda/test_adamw.cpp (CpuEngine's
//   adamw_step operation by operation), the test's tensors and 5 steps:
//   master atol 2e-6, exp_avg rtol 1e-5 atol 1e-9, exp_avg_sq rtol 1e-5 atol
//   1e-12; the bf16 copy exactly bf16(master); elements outside every chunk
//   untouched; the vector path (kVec) and the scalar one bit-identical.
//   AdamWConsts is built as adamw_step builds it.
#include "gen_adamw.h"
#include "gen_swiglu.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

#include <algorithm>
#include <cstring>

namespace simt {
namespace {

namespace kc = kvs::cuda;

// grid_cap > 0: at most that many blocks instead of the launcher's grid, so the
// grid-stride loop takes several passes (the launcher's 65536-block cap is
// reached only past 16M chunks, far beyond these sizes).
void swiglu(int N, int F, bool vec, unsigned grid_cap = 0) {
  const int V = vec ? 8 : 1;
  const std::string tag = "swiglu W=" + std::to_string(V) + " N" + std::to_string(N) + " F" + std::to_string(F) +
                          (grid_cap ? " grid " + std::to_string(grid_cap) : "");
  const size_t n = (size_t)N * F;
  const unsigned blocks = grid_cap ? std::min(grid_cap, kc::blocks_for(n / V)) : kc::blocks_for(n / V);
  // forward
  {
    const auto gu = randn(n * 2, 100 + F, 2.0f);
    std::vector<double> want(n);
    kvs::cpu::swiglu_forward<double>(want.data(), std::vector<double>(gu.begin(), gu.end()).data(), N, F);
    const auto gub = b16(gu);
    std::vector<bf16> out(n, poison_bf16());
    emu::launch(emu::Dim{blocks, 1, 1}, kc::kThreads, [&] {
      if (vec) kc::swiglu_forward_kernel<8>(out.data(), gub.data(), N, F);
      else kc::swiglu_forward_kernel<1>(out.data(), gub.data(), N, F);
    });
    check(tag, "out", f32(out), want, 1e-2, 1e-4);
  }
  // backward
  {
    const auto gu = randn(n * 2, 110 + F, 2.0f), dout = randn(n, 120 + F);
    std::vector<double> want(2 * n, 0.0);
    const std::vector<double> doutd(dout.begin(), dout.end()), gud(gu.begin(), gu.end());
    kvs::cpu::swiglu_backward<double>(want.data(), doutd.data(), gud.data(), N, F);
    const auto gub = b16(gu), db = b16(dout);
    std::vector<bf16> dgu(2 * n, poison_bf16());
    emu::launch(emu::Dim{blocks, 1, 1}, kc::kThreads, [&] {
      if (vec) kc::swiglu_backward_kernel<8>(dgu.data(), db.data(), gub.data(), N, F);
      else kc::swiglu_backward_kernel<1>(dgu.data(), db.data(), gub.data(), N, F);
    });
    check(tag, "dgate_up", f32(dgu), want, 1e-2, 1e-4);
  }
  done(tag);
}

struct HostTensor {
  size_t offset, numel;
  bool decay, clamp01;
};

void adamw() {
  const std::string tag = "adamw";
  const std::vector<HostTensor> tensors = {
      {0, 1000, true, false},
      {1024, 70000, true, false},  // > kAdamWChunkElems: two chunks
      {71040, 37, false, false},
      {71104, 300, false, true},  // clamp01, no decay
      {71424, 129, true, true},   // clamp01 and decay
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
  std::mt19937_64 g(101);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> params(total, 7.0f), m(total, 0.0f), v(total, 0.0f);
  for (const HostTensor& t : tensors)
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) params[i] = t.clamp01 ? 0.5f + 0.6f * nd(g) : 0.5f * nd(g);
  std::vector<float> dp = params, dm = m, dv = v;
  std::vector<bf16> dbf(total, poison_bf16());
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1, gscale = 0.5;
  for (int step = 1; step <= 5; ++step) {
    const std::string t = tag + " step " + std::to_string(step);
    std::vector<float> grads(total);
    for (auto& x : grads) x = nd(g);
    // The kernel's constants, as adamw_step derives them from AdamWArgs' floats.
    const float bc1 = (float)(1.0 - std::pow(beta1, (double)step)), bc2 = (float)(1.0 - std::pow(beta2, (double)step));
    kc::AdamWConsts c;
    c.beta1 = (float)beta1;
    c.one_minus_beta1 = 1.0f - (float)beta1;
    c.beta2 = (float)beta2;
    c.one_minus_beta2 = 1.0f - (float)beta2;
    c.eps = (float)eps;
    c.grad_scale = (float)gscale;
    c.step_size = (float)((double)(float)lr / (double)bc1);
    c.inv_sqrt_bc2 = (float)(1.0 / std::sqrt((double)bc2));
    c.decay = 1.0f - (float)lr * (float)wd;
    // Both paths from the same state: the scalar one (kVec false, for
    // misaligned buffers) on copies, which must end bit-identical.
    std::vector<float> sp = dp, sm = dm, sv = dv;
    std::vector<bf16> sbf = dbf;
    emu::launch(emu::Dim{(unsigned)chunks.size(), 1, 1}, kc::kAdamWThreads, [&] {
      kc::adamw_kernel<true>(dp.data(), dbf.data(), grads.data(), dm.data(), dv.data(), chunks.data(), c);
    });
    emu::launch(emu::Dim{(unsigned)chunks.size(), 1, 1}, kc::kAdamWThreads, [&] {
      kc::adamw_kernel<false>(sp.data(), sbf.data(), grads.data(), sm.data(), sv.data(), chunks.data(), c);
    });
    expect(std::memcmp(sp.data(), dp.data(), total * sizeof(float)) == 0 &&
               std::memcmp(sm.data(), dm.data(), total * sizeof(float)) == 0 &&
               std::memcmp(sv.data(), dv.data(), total * sizeof(float)) == 0 &&
               std::memcmp(sbf.data(), dbf.data(), total * sizeof(bf16)) == 0,
           t, "the vector and scalar paths differ");
    // CpuEngine::adamw_step, operation for operation (tests/kernels/cuda/test_adamw.cpp's host_adamw).
    {
      const double hbc1 = 1.0 - std::pow(beta1, (double)step), hbc2 = 1.0 - std::pow(beta2, (double)step);
      const float b1 = (float)beta1, b2 = (float)beta2, flr = (float)lr, feps = (float)eps, sc = (float)gscale;
      const float step_size = (float)(lr / hbc1), inv_sqrt_bc2 = (float)(1.0 / std::sqrt(hbc2));
      for (const HostTensor& ht : tensors) {
        const float decay = ht.decay ? 1.0f - flr * (float)wd : 1.0f;
        for (size_t i = ht.offset; i < ht.offset + ht.numel; ++i) {
          const float gi = grads[i] * sc;
          m[i] = b1 * m[i] + (1.0f - b1) * gi;
          v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
          const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + feps;
          params[i] = params[i] * decay - step_size * m[i] / denom;
          if (ht.clamp01) params[i] = std::clamp(params[i], 0.0f, 1.0f);
        }
      }
    }
    check(t, "master", dp, params, 0.0, 2e-6);
    check(t, "exp_avg", dm, m, 1e-5, 1e-9);
    check(t, "exp_avg_sq", dv, v, 1e-5, 1e-12);
    size_t bad_copy = 0, gap_touched = 0;
    for (size_t i = 0; i < total; ++i) {
      if (covered[i]) bad_copy += __bfloat16_as_ushort(dbf[i]) != __bfloat16_as_ushort(__float2bfloat16_rn(dp[i]));
      else gap_touched += dp[i] != 7.0f || dm[i] != 0.0f || dv[i] != 0.0f || __bfloat16_as_ushort(dbf[i]) != 0xFFFF;
    }
    expect(bad_copy == 0, t, "bf16 copy != bf16(master)");
    expect(gap_touched == 0, t, "elements outside every chunk changed");
  }
  size_t on_box = 0;
  for (const HostTensor& t : tensors)
    if (t.clamp01)
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) on_box += params[i] == 0.0f || params[i] == 1.0f;
  expect(on_box > 0, tag, "clamp never reached (the case does not exercise clamp01)");
  done(tag);
}

}  // namespace

void run_swiglu() {
  // tests/kernels/cuda/test_swiglu.cpp's kSwigluShapes {N, F}: {1, 1}, {3, 13}, {8, 64}, {5, 1000}, {2, 4104}
  const int shapes[][2] = {{1, 1}, {3, 13}, {8, 64}, {5, 1000}, {2, 4104}};
  for (const auto& s : shapes) {
    if (s[1] % 8 == 0) swiglu(s[0], s[1], true);
    swiglu(s[0], s[1], false);
  }
  // 3 blocks of 256 over 2064 chunks of 8 (16512 elements one at a time): 3 and 22 passes.
  swiglu(16, 1032, true, 3);
  swiglu(16, 1032, false, 3);
}

void run_adamw() { adamw(); }

}  // namespace simt
