// The losses under the emulator:
// - cross_entropy_kernel (fused loss + dlogits + argmax) vs
//   kvs::cpu::cross_entropy_forward_backward in double, with
//   tests/kernels/cuda/test_cross_entropy.cpp's cases and tolerances: loss rtol 1e-5, atol 2e-5;
//   dlogits (bf16) rtol 1/256, atol 1e-6 grad_scale; argmax exact; masked rows
//   (target -1, never read) give loss 0 and zero gradients.
// - the vocab-parallel loss (local_kernel, rescale_kernel, finish_kernel) with
//   the all-reduces done on the host between them, as tests/parallel/test_cuda_tp.cpp:
//   every rank's losses within rtol 1e-5, atol 1e-6 and dlogits within rtol
//   1/128, atol 1e-6 of both the emulated fused kernel on the whole row and the
//   CPU reference; argmax exact; padding columns of dlogits +0.0; with dlogits
//   null the logits are untouched.
// Launches mirror cross_entropy_forward_backward and vocab_parallel_ce_*.
#include "gen_cross_entropy.h"
#include "gen_vocab_parallel_ce.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

#include <algorithm>

namespace simt {
namespace {

namespace kc = kvs::cuda;

template <int W>
void ce(int N, int V, bool use_mask, bool in_place, float scale) {
  const std::string tag = "cross_entropy W=" + std::to_string(W) + " N" + std::to_string(N) + " V" +
                          std::to_string(V) + (use_mask ? " mask" : "") + (in_place ? " in-place" : "");
  const auto lg = randn((size_t)N * V, 71 + V, scale);
  std::mt19937_64 g(72);
  std::vector<int32_t> tg(N);
  std::vector<float> mask(N, 1.f);
  int active = 0;
  for (int n = 0; n < N; ++n) {
    tg[n] = int32_t(g() % uint64_t(V));
    if (use_mask) {
      if (n % 3 == 1) mask[n] = 0;
      if (n == 2) mask[n] = 0.5f;
      if (mask[n] == 0) tg[n] = -1;
    }
    active += mask[n] != 0;
  }
  const float gs = 1.0f / std::max(active, 1);
  auto lb = b16(lg);
  std::vector<bf16> sep((size_t)N * V, poison_bf16());
  bf16* dl = in_place ? lb.data() : sep.data();
  std::vector<float> loss(N, NAN);
  std::vector<int32_t> am(N, -7);
  const int items = W == 8 ? V / 8 : V;
  const int thr = std::min(512, (items + 31) / 32 * 32);
  emu::launch(emu::Dim{(unsigned)N, 1, 1}, thr, [&] {
    kc::cross_entropy_kernel<W>(loss.data(), dl, am.data(), lb.data(), tg.data(), use_mask ? mask.data() : nullptr, V,
                                gs);
  });
  const std::vector<double> x(lg.begin(), lg.end());
  std::vector<double> wl(N), wd((size_t)N * V);
  std::vector<int32_t> wam(N);
  kvs::cpu::cross_entropy_forward_backward<double>(wl.data(), wd.data(), wam.data(), x.data(), tg.data(),
                                                   use_mask ? mask.data() : nullptr, N, V, gs);
  const auto dlog = f32(in_place ? lb : sep);
  check(tag, "loss", loss, wl, 1e-5, 2e-5);
  check(tag, "dlogits", dlog, wd, 1.0 / 256, 1e-6 * gs);
  expect(am == wam, tag, "argmax");
  for (int n = 0; n < N; ++n) {
    if (mask[n] != 0.0f) continue;
    bool zero = loss[n] == 0.0f;
    for (int v = 0; v < V; ++v) zero &= dlog[(size_t)n * V + v] == 0.0f;
    expect(zero, tag, "masked row not zero");
  }
  done(tag);
}

std::vector<float> slice(const std::vector<float>& full, int N, int Vf, int vb, int V, float pad) {
  std::vector<float> o((size_t)N * V, pad);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V && vb + v < Vf; ++v) o[(size_t)n * V + v] = full[(size_t)n * Vf + vb + v];
  return o;
}

struct VpCase {
  std::string name;
  int N, Vfull, tp, V;
  int mask_mode;  // 0 none, 1 one row 0 and one 0.5, 2 all masked
  bool want_argmax, with_dlogits;
  float pad;  // what the padding columns of the logits hold (the kernels must ignore it)
};

void vp(const VpCase& c) {
  const int N = c.N, Vf = c.Vfull, tp = c.tp, V = c.V;
  const float gs = 0.25f;
  const std::string tag = "vocab_parallel_ce " + c.name;
  std::vector<float> logits = randn((size_t)N * Vf, 11, 2.0f);
  for (size_t i = 0; i < logits.size(); i += 3) logits[i] = std::round(logits[i]);  // ties for argmax
  std::vector<int32_t> tg(N);
  std::vector<float> mask(N, 1.0f);
  for (int n = 0; n < N; ++n) tg[n] = (n * 53 + 7) % Vf;
  if (c.mask_mode == 1) {
    mask[std::min(3, N - 1)] = 0.0f;
    if (N > 20) mask[20] = 0.5f;
  }
  if (c.mask_mode == 2)
    for (auto& m : mask) m = 0.0f;
  // Oracle 1: the emulated fused kernel on whole rows (the launcher's W and threads).
  std::vector<bf16> full = b16(logits), dfull((size_t)N * Vf, poison_bf16());
  std::vector<float> wl(N, NAN);
  std::vector<int32_t> wam(N, -7);
  const bool vec = Vf % 8 == 0;
  const int thr = std::min(512, ((vec ? Vf / 8 : Vf) + 31) / 32 * 32);
  emu::launch(emu::Dim{(unsigned)N, 1, 1}, thr, [&] {
    if (vec) kc::cross_entropy_kernel<8>(wl.data(), dfull.data(), wam.data(), full.data(), tg.data(), mask.data(), Vf, gs);
    else kc::cross_entropy_kernel<1>(wl.data(), dfull.data(), wam.data(), full.data(), tg.data(), mask.data(), Vf, gs);
  });
  const std::vector<float> wd = f32(dfull);
  // Oracle 2: the CPU reference in double.
  const std::vector<double> xd(logits.begin(), logits.end());
  std::vector<double> cl(N), cd((size_t)N * Vf);
  std::vector<int32_t> cam(N);
  kvs::cpu::cross_entropy_forward_backward<double>(cl.data(), cd.data(), cam.data(), xd.data(), tg.data(), mask.data(),
                                                   N, Vf, gs);
  struct Rank {
    int vb, valid;
    std::vector<bf16> x, orig;
    std::vector<float> stats, loss;
    std::vector<int32_t> arg;
  };
  std::vector<Rank> R(tp);
  for (int r = 0; r < tp; ++r) {
    R[r].vb = r * V;
    R[r].valid = std::clamp(Vf - R[r].vb, 0, V);
    R[r].x = b16(slice(logits, N, Vf, R[r].vb, V, c.pad));
    R[r].orig = R[r].x;
    R[r].stats.assign(kc::VocabCeStats::floats(N), NAN);
    R[r].loss.assign(N, NAN);
    R[r].arg.assign(N, -7);
  }
  auto all_reduce = [&](size_t off, size_t n, bool mx) {
    for (size_t i = off; i < off + n; ++i) {
      float acc = R[0].stats[i];
      for (int r = 1; r < tp; ++r) acc = mx ? std::max(acc, R[r].stats[i]) : acc + R[r].stats[i];
      for (int r = 0; r < tp; ++r) R[r].stats[i] = acc;
    }
  };
  // The sequence of parallel/tensor_parallel's loss: local, all-reduce max, rescale,
  // all-reduce sums (and argmax), finish.
  const int rt = kc::row_threads(V);
  for (auto& k : R) {
    const auto st = kc::VocabCeStats::at(k.stats.data(), N);
    emu::launch(emu::Dim{(unsigned)N, 1, 1}, rt, [&] {
      kc::local_kernel(st, k.x.data(), tg.data(), mask.data(), V, k.valid, k.vb, c.want_argmax);
    });
  }
  all_reduce(0, N, true);
  for (auto& k : R) {
    const auto st = kc::VocabCeStats::at(k.stats.data(), N);
    emu::launch(emu::Dim{kc::ceil_div(N, 256), 1, 1}, 256, [&] { kc::rescale_kernel(st, mask.data(), N, k.vb); });
  }
  all_reduce(2 * (size_t)N, 2 * (size_t)N, false);
  if (c.want_argmax) all_reduce(4 * (size_t)N, N, true);
  for (auto& k : R) {
    const auto st = kc::VocabCeStats::at(k.stats.data(), N);
    emu::launch(emu::Dim{(unsigned)N, 1, 1}, rt, [&] {
      kc::finish_kernel(k.loss.data(), c.with_dlogits ? k.x.data() : nullptr, c.want_argmax ? k.arg.data() : nullptr,
                        st, k.x.data(), tg.data(), mask.data(), V, k.valid, k.vb, gs);
    });
  }
  for (int r = 0; r < tp; ++r) {
    Rank& k = R[r];
    const std::string t = tag + " rank " + std::to_string(r);
    check(t, "loss vs fused", k.loss, wl, 1e-5, 1e-6);
    check(t, "loss vs cpu", k.loss, cl, 1e-5, 1e-6);
    if (c.want_argmax) {
      expect(k.arg == wam, t, "argmax vs fused");
      expect(k.arg == cam, t, "argmax vs cpu");
    } else {
      expect(std::all_of(k.arg.begin(), k.arg.end(), [](int v) { return v == -7; }), t, "argmax written");
    }
    if (c.with_dlogits) {
      const std::vector<float> got = f32(k.x);
      check(t, "dlogits vs fused", got, slice(wd, N, Vf, k.vb, V, 0.0f), 1.0 / 128, 1e-6);
      std::vector<double> want((size_t)N * V, 0.0);
      for (int n = 0; n < N; ++n)
        for (int v = 0; v < k.valid; ++v) want[(size_t)n * V + v] = cd[(size_t)n * Vf + k.vb + v];
      check(t, "dlogits vs cpu", got, want, 1.0 / 128, 1e-6);
      size_t badpad = 0;
      for (int n = 0; n < N; ++n)
        for (int v = k.valid; v < V; ++v) badpad += __bfloat16_as_ushort(k.x[(size_t)n * V + v]) != 0;
      expect(badpad == 0, t, "padding columns of dlogits not +0.0");
    } else {
      bool same = true;
      for (size_t i = 0; i < k.x.size(); ++i) same &= __bfloat16_as_ushort(k.x[i]) == __bfloat16_as_ushort(k.orig[i]);
      expect(same, t, "logits modified with dlogits null");
    }
    size_t nan = 0;
    for (size_t i = 0; i < 5 * (size_t)N; ++i) nan += std::isnan(k.stats[i]);
    expect(nan == 0, t, "statistics left unwritten (NaN)");
  }
  done(tag);
}

}  // namespace

void run_cross_entropy() {
  // tests/kernels/cuda/test_cross_entropy.cpp's CeCase list (N reduced from 8/6 to 3 for the 32000-wide rows).
  ce<8>(3, 32000, true, false, 2.f);
  ce<8>(3, 32000, true, true, 2.f);
  ce<8>(3, 32000, false, true, 8.f);  // peaked softmax, no mask
  ce<1>(33, 37, true, false, 1.f);    // odd V: element-wise path
  ce<1>(33, 37, true, true, 1.f);
  ce<8>(64, 256, true, true, 3.f);
  ce<8>(7, 1000, false, false, .5f);
  ce<1>(7, 1000, false, false, .5f);  // the scalar path on a V % 8 == 0 row (unaligned pointers)
  ce<1>(5, 1, true, false, 1.f);      // V = 1: loss 0, gradient 0
  ce<8>(3, 2056, true, true, 4.f);    // V % 8 == 0, not a warp multiple
}

void run_vocab_parallel_ce() {
  // {name, N, Vfull, tp, V (local width), mask mode, argmax, dlogits, padding value}
  vp({"vocab 200 tp 2", 37, 200, 2, 128, 1, true, true, 0.0f});  // tests/parallel/test_cuda_tp.cpp's case: rank 1 has 56 padding columns
  vp({"vocab 200 tp 2 no argmax", 37, 200, 2, 128, 1, false, true, 0.0f});
  vp({"vocab 200 tp 2 padding 1e4", 37, 200, 2, 128, 1, true, true, 1e4f});
  vp({"vocab 200 tp 2 eval (no dlogits)", 37, 200, 2, 128, 1, true, false, 0.0f});
  vp({"vocab 32 tp 2 (rank 1 padding only)", 37, 32, 2, 128, 1, true, true, 0.0f});
  vp({"vocab 200 tp 2 all masked", 37, 200, 2, 128, 2, true, true, 0.0f});
  vp({"vocab 1500 tp 2 (512 threads, striding)", 9, 1500, 2, 768, 1, true, true, 0.0f});
  vp({"vocab 100 tp 3 V 37 (rank 2 partial)", 11, 100, 3, 37, 1, true, true, 0.0f});
  vp({"vocab 40 tp 2 V 20 N 300 (rescale: 2 blocks)", 300, 40, 2, 20, 1, true, true, 0.0f});
}

}  // namespace simt
