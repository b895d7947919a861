// RMSNorm (residual_rmsnorm_forward_kernel, rmsnorm_backward_kernel,
// rmsnorm_dw_reduce_kernel with its 32 x 32 block) under the emulator vs
// kvs::cpu::rmsnorm_forward/backward in double, with
// tests/kernels/cuda/test_rmsnorm.cpp's shapes, modes and tolerances:
//   resid_out: exact (bf16(a + b)); out (bf16): rtol 1e-2, atol 1e-4; rstd: rtol 1e-5
//   dinp (bf16): rtol 1e-2, atol 1e-3; dw (fp32, added into random initial values): rtol 1e-4, atol 1e-4
// Both vector widths where the launcher could take V = 8 (C % 8 == 0).
// Launches mirror residual_rmsnorm_forward/rmsnorm_backward: N blocks of
// row_threads(C); backward_blocks(N, C) blocks with C floats of dynamic shared
// memory; then ceil(C / 32) blocks of 32 x 32 for dw.
#include "gen_rmsnorm.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

namespace simt {
namespace {

namespace kc = kvs::cuda;

// fwd_modes / bwd_modes: bit m set runs mode m.
// eps 0.5 (against rows of mean square about 1) checks that the kernel uses
// the eps it is given inside the root: at 1e-5 a dropped eps stays within rtol.
template <int V>
void run(int N, int C, int fwd_modes = 7, int bwd_modes = 7, float eps = 1e-5f) {
  const size_t n = (size_t)N * C;
  const int thr = kc::row_threads(C);
  const std::string tag = "rmsnorm V=" + std::to_string(V) + " N" + std::to_string(N) + " C" + std::to_string(C) +
                          (eps != 1e-5f ? " eps " + std::to_string(eps) : "");
  auto w = randn(C, 30, 0.2f);
  for (auto& x : w) x += 1;
  for (int mode = 0; mode < 3; ++mode) {  // 0: no b; 1: resid_out separate; 2: resid_out aliases a
    if (!(fwd_modes >> mode & 1)) continue;
    const std::string t = tag + " fwd mode " + std::to_string(mode);
    const auto a = randn(n, 10 + C), b = randn(n, 20 + C);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = mode == 0 ? a[i] : r16(a[i] + b[i]);
    const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
    std::vector<double> want(n), want_rstd(N);
    kvs::cpu::rmsnorm_forward<double>(want.data(), want_rstd.data(), xd.data(), wd.data(), N, C, eps);
    auto ab = b16(a), bb = b16(b);
    std::vector<bf16> res(n, poison_bf16()), out(n, poison_bf16());
    std::vector<float> rstd(N, NAN);
    bf16* ro = mode == 2 ? ab.data() : res.data();
    emu::launch(emu::Dim{(unsigned)N, 1, 1}, thr, [&] {
      kc::residual_rmsnorm_forward_kernel<V>(ro, out.data(), rstd.data(), ab.data(), mode ? bb.data() : nullptr,
                                             w.data(), C, eps);
    });
    if (mode) check(t, "resid_out", f32(mode == 2 ? ab : res), x, 0, 0);
    check(t, "out", f32(out), want, 1e-2, 1e-4);
    check(t, "rstd", rstd, want_rstd, 1e-5, 0);
  }
  for (int mode = 0; mode < 3; ++mode) {  // 0: no dresid; 1: dresid separate; 2: dinp aliases dresid
    if (!(bwd_modes >> mode & 1)) continue;
    const std::string t = tag + " bwd mode " + std::to_string(mode);
    const auto x = randn(n, 40 + C), dout = randn(n, 50 + C), dres = randn(n, 60 + C);
    const auto dw0 = randu(C, 80, -1.0f, 1.0f, false);
    std::vector<float> o(n), rstd(N);
    kvs::cpu::rmsnorm_forward<float>(o.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    std::vector<double> want_dx(n, 0.0), want_dw(dw0.begin(), dw0.end());
    if (mode)
      for (size_t i = 0; i < n; ++i) want_dx[i] = dres[i];
    const std::vector<double> doutd(dout.begin(), dout.end()), xd(x.begin(), x.end()), wd(w.begin(), w.end()),
        rd(rstd.begin(), rstd.end());
    kvs::cpu::rmsnorm_backward<double>(want_dx.data(), want_dw.data(), doutd.data(), xd.data(), wd.data(), rd.data(),
                                       N, C);
    auto xb = b16(x), db = b16(dout), rb = b16(dres);
    std::vector<bf16> dx(n, poison_bf16());
    const int G = kc::backward_blocks(N, C);
    std::vector<float> partial((size_t)G * C, NAN), dw = dw0;  // scratch starts poisoned
    if (C * sizeof(float) > emu::kDynBytes) {
      expect(false, t, "shared memory beyond the emulator's");
      continue;
    }
    bf16* dxp = mode == 2 ? rb.data() : dx.data();
    emu::launch(emu::Dim{(unsigned)G, 1, 1}, thr, [&] {
      kc::rmsnorm_backward_kernel<V>(dxp, partial.data(), db.data(), mode ? rb.data() : nullptr, xb.data(), w.data(),
                                     rstd.data(), N, C);
    });
    emu::launch(emu::Dim{(unsigned)((C + 31) / 32), 1, 1}, emu::Dim{32, 32, 1},
                [&] { kc::rmsnorm_dw_reduce_kernel(dw.data(), partial.data(), G, C); });
    check(t, "dinp", f32(mode == 2 ? rb : dx), want_dx, 1e-2, 1e-3);
    check(t, "dw", dw, want_dw, 1e-4, 1e-4);
  }
  done(tag);
}

}  // namespace

void run_rmsnorm() {
  // tests/kernels/cuda/test_rmsnorm.cpp's kRmsShapes: {1, 8}, {5, 37}, {16, 768}, {3, 2051}, {2, 8200}
  // (C = 2051: 1024 threads, rows wider than the block).
  run<8>(1, 8);
  run<1>(1, 8);
  run<1>(5, 37);
  run<8>(16, 768);
  run<1>(16, 768);
  run<1>(3, 2051);
  run<8>(2, 8200);
  // backward_blocks < N: 256 blocks of 1024 threads for 258 rows, blocks 0 and 1 take two rows each
  // (the backward only, with dinp aliasing dresid: the forward has one block per row anyway).
  run<1>(258, 1001, 0, 4);
  // The forward with eps 0.5, both widths.
  run<8>(16, 768, 7, 0, 0.5f);
  run<1>(5, 37, 7, 0, 0.5f);
}

}  // namespace simt
