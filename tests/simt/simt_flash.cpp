// Flash attention forward (fwd_kernel, both tile-load paths) and backward (delta_kernel, dkdv_kernel,
// dq_kernel, both paths), and the Hopper (wgmma) kernels fwd_sm90_kernel, dkdv_sm90_kernel and
// dq_sm90_kernel at head dims 64 and 128, under the emulator vs kvs::cpu::attention_forward/backward in
// double. Same problems as tests/kernels/cuda/test_flash_attention.cpp (B = 2, Hq = 4,
// bf16-rounded normal inputs, the three buffer layouts) and its tolerances:
//   out (bf16): rtol 1e-2, atol 1e-2, and ||err|| <= 5e-3 ||ref|| + 1e-3 sqrt(n)
//   lse (fp32): rtol 1e-5, atol 2e-4
//   dq, dk, dv (bf16): rtol 2e-2, atol 1e-2 max|ref| + 1e-3, ||err|| <= 1e-2 ||ref|| + 1e-3 sqrt(n)
// plus: padding columns and the bytes past the buffers stay poisoned. The
// backward runs from the reference out (rounded to bf16) and lse, as the GPU
// test's does from the kernels' own forward. Grids mirror launch_fwd/launch_bwd.
// Also without the causal mask (ring attention's block of an earlier chunk:
// the reference's queries at positions T .. 2T - 1 see every key), same tolerances.
// And with document masks (kDocs, the cp.async and the Hopper kernels: each
// query sees the keys of its own document only, and the tiles wholly outside a
// block's documents are skipped) against the CPU ops' doc_start, same
// tolerances; causal, and without the causal mask in ring attention's form
// (the starts in the query chunk's coordinates, the keys' chunk before it at
// key_row0 = -T, queries whose document starts after every key: lse -inf, out
// 0, and in the backward the finite lse a merge gives them).
#include <array>

#include "gen_flash_attention_bwd.h"
#include "gen_flash_attention_bwd_sm90.h"
#include "gen_flash_attention_fwd.h"
#include "gen_flash_attention_fwd_sm90.h"
#include "kernels/cpu/ops.h"
#include "simt_util.h"

namespace simt {
namespace {

using namespace kvs::cuda::flash;

bool norm_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  double e2 = 0, w2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = (double)got[i] - want[i];
    e2 += e * e;
    w2 += want[i] * want[i];
  }
  return std::sqrt(e2) <= rel * std::sqrt(w2) + 1e-3 * std::sqrt((double)want.size());
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// lse against the reference: the same rows -inf (no visible key), the others
// within rtol 1e-5, atol 2e-4.
void check_lse(const std::string& tag, const std::vector<float>& got, const std::vector<double>& want) {
  std::vector<float> g = got;
  std::vector<double> w = want;
  size_t inf_mismatch = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      inf_mismatch += !(std::isinf(w[i]) && std::isinf(g[i]) && w[i] < 0 && g[i] < 0);
      g[i] = 0, w[i] = 0;
    }
  expect(inf_mismatch == 0, tag, "lse: rows that see no key must be -inf, and only those");
  check(tag, "lse", g, w, 1e-5, 2e-4);
}

// Document starts [B][T] for `run`'s masks: documents of 1 to 70 rows (a
// start inside most 64-row tiles, and some tiles inside one document).
std::vector<int32_t> document_starts(int B, int T, uint64_t seed) {
  std::vector<int32_t> doc((size_t)B * T);
  for (int b = 0; b < B; ++b) {
    int start = 0, next = 1 + (int)((seed + 13 * b) % 40);
    for (int t = 0; t < T; ++t) {
      if (t == next) start = t, next = t + 1 + (t * 37 + b * 11) % 70;
      doc[(size_t)b * T + t] = start;
    }
  }
  return doc;
}

// A Hopper path's name in the failure lines: "sm90 (wgmma, 2 warpgroups)".
std::string wgmma_path(int groups) {
  return "sm90 (wgmma, " + std::to_string(groups) + (groups > 1 ? " warpgroups)" : " warpgroup)");
}

template <int D>
void run(int B, int T, int Hq, int Hkv, int layout, uint64_t seed, float qk_scale, bool causal = true,
         bool docs = false) {
  static_assert(dkdv_smem_bytes<D, true>() <= emu::kDynBytes && dq_smem_bytes<D, true>() <= emu::kDynBytes);
  const std::string tag = "flash D=" + std::to_string(D) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                          " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                          " layout=" + std::to_string(layout) + (qk_scale != 1.0f ? " peaked" : "") +
                          (causal ? "" : " full") + (docs ? " documents" : "");
  // Documents: starts over the T positions, or without the causal mask over
  // the 2T positions of keys and queries, the queries' half (positions T ..
  // 2T - 1) for the reference and, shifted by -T, for the kernels.
  std::vector<int32_t> docv, kdocv;
  if (docs) {
    const std::vector<int32_t> all = document_starts(B, causal ? T : 2 * T, seed);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) docv.push_back(all[(size_t)b * (causal ? T : 2 * T) + (causal ? 0 : T) + t]);
    for (int32_t d : docv) kdocv.push_back(causal ? d : d - T);
  }
  const int32_t* doc = docs ? docv.data() : nullptr;     // the reference's (positions)
  const int32_t* kdoc = docs ? kdocv.data() : nullptr;   // the kernels' (query rows; keys from key_row0)
  const int key_row0 = causal ? 0 : -T;
  const int G = Hq / Hkv;
  const size_t N = (size_t)B * T, QD = (size_t)Hq * D, KD = (size_t)Hkv * D;
  const auto q = randn(N * QD, seed + 1, qk_scale), k = randn(N * KD, seed + 2, qk_scale), v = randn(N * KD, seed + 3),
             dout = randn(N * QD, seed + 4);
  // layouts: 0 contiguous, 1 one fused [N, QD + 2 KD] buffer, 2 padded rows
  int ld_q = QD, ld_kv = KD;
  size_t koff = 0, voff = 0;
  if (layout == 1) {
    ld_q = ld_kv = QD + 2 * KD;
    koff = QD;
    voff = QD + KD;
  } else if (layout == 2) {
    ld_q = QD + 8;
    ld_kv = KD + 24;
  }
  auto mk = [&](size_t rows, int ld) { return std::vector<bf16>(rows * ld + 64, poison_bf16()); };
  std::vector<bf16> Qb = mk(N, ld_q), dQb = mk(N, ld_q), Kb, Vb, dKb, dVb;
  bf16 *qp = Qb.data(), *kp, *vp, *dqp = dQb.data(), *dkp, *dvp;
  if (layout == 1) {
    kp = qp + koff, vp = qp + voff, dkp = dqp + koff, dvp = dqp + voff;
  } else {
    Kb = mk(N, ld_kv), Vb = mk(N, ld_kv), dKb = mk(N, ld_kv), dVb = mk(N, ld_kv);
    kp = Kb.data(), vp = Vb.data(), dkp = dKb.data(), dvp = dVb.data();
  }
  for (size_t n = 0; n < N; ++n) {
    for (size_t i = 0; i < QD; ++i) qp[n * ld_q + i] = __float2bfloat16_rn(q[n * QD + i]);
    for (size_t i = 0; i < KD; ++i) {
      kp[n * ld_kv + i] = __float2bfloat16_rn(k[n * KD + i]);
      vp[n * ld_kv + i] = __float2bfloat16_rn(v[n * KD + i]);
    }
  }
  const std::vector<bf16> doutb = b16(dout);
  std::vector<bf16> out(N * QD, poison_bf16());
  std::vector<float> lse((size_t)B * Hq * T, NAN), delta((size_t)B * Hq * T, NAN);
  const float scale = 1.0f / std::sqrt((float)D);

  // Reference in double (as tests/kernels/cuda/cuda_attention_problem.h).
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
      dod(dout.begin(), dout.end());
  std::vector<double> outr(N * QD, 0.0), att((size_t)B * Hq * T * T);
  const int qpos0 = causal ? 0 : T;  // non-causal: every query after every key
  std::vector<double> lser((size_t)B * Hq * T);
  kvs::cpu::attention_forward<double>(outr.data(), att.data(), docs ? lser.data() : nullptr, qd.data(), kd.data(),
                                      vd.data(), B, T, T, Hq, Hkv, D, qpos0, 0, doc);
  for (int b = 0; b < B && !docs; ++b)  // (with documents, the CPU op's lse)
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < T; ++t) {
        const int last = causal ? t : T - 1;
        std::vector<double> s(last + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          double a = 0;
          for (int d = 0; d < D; ++d) a += qd[(size_t)(b * T + t) * QD + h * D + d] * kd[(size_t)(b * T + j) * KD + (h / G) * D + d];
          s[j] = a / std::sqrt((double)D);
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) sum += std::exp(s[j] - mx);
        lser[((size_t)b * Hq + h) * T + t] = mx + std::log(sum);
      }
  std::vector<double> dqr(N * QD, 0.0), dkr(N * KD, 0.0), dvr(N * KD, 0.0);
  kvs::cpu::attention_backward<double>(dqr.data(), dkr.data(), dvr.data(), dod.data(), qd.data(),
                                       kd.data(), vd.data(), att.data(), B, T, T, Hq, Hkv, D, qpos0, 0);

  // Forward: grid (ceil(T / 64), Hq, B), kThreads threads (launch_fwd), with
  // both tile-load paths (FlashLoads), each into freshly poisoned outputs, and
  // at D = 64 and 128 the Hopper kernel (fwd_sm90_kernel, launch_fwd_sm90: the
  // same grid, its dynamic shared memory). Every path after the first must
  // give the first one's bits: the same MMAs in the same order (under the
  // emulator every MMA is rounded once per k-step of 16; on a GPU the tensor
  // cores' internal accumulation may differ, so the GPU test holds the Hopper
  // kernels to the tolerances only). Documents: the sync loads have none.
  const unsigned nqt = (unsigned)((T + 16 * kWarps - 1) / (16 * kWarps));
  emu::g_ldmatrix_matrices = emu::g_ldmatrix_conflicts = 0;
  std::vector<bf16> first_out;
  std::vector<float> first_lse;
  // sync, cp.async + ldmatrix, sm90 with 1, 2 and 3 warpgroups per block
  // (launch_fwd_sm90's groups: blocks of 64 groups rows, 128 groups threads).
  constexpr int kPaths = D == 64 || D == 128 ? 5 : 2;
  for (int path = 0; path < kPaths; ++path) {
    if (docs && path == 0) continue;
    std::fill(out.begin(), out.end(), poison_bf16());
    std::fill(lse.begin(), lse.end(), NAN);
    const int groups = path >= 2 ? path - 1 : 1;
    const unsigned blocks = (unsigned)((T + 64 * groups - 1) / (64 * groups));
    emu::launch({blocks, (unsigned)Hq, (unsigned)B}, groups * kThreads, [&] {  // blocks = nqt at 1 warpgroup
      if constexpr (kPaths == 5) {
        static_assert(sm90_fwd_smem_bytes<D, 3>() <= emu::kDynBytes);
        auto sm90 = [&]<int kGroups>() {
          if (docs)
            return fwd_sm90_kernel<D, true, kGroups>(out.data(), lse.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale,
                                                     scale * kLog2e, causal, kdoc, key_row0);
          return fwd_sm90_kernel<D, false, kGroups>(out.data(), lse.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale,
                                                    scale * kLog2e, causal);
        };
        if (path == 2) return sm90.template operator()<1>();
        if (path == 3) return sm90.template operator()<2>();
        if (path == 4) return sm90.template operator()<3>();
      }
      if (docs)
        fwd_kernel<D, true, true>(out.data(), lse.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale, scale * kLog2e,
                                  causal, kdoc, key_row0);
      else if (path == 1)
        fwd_kernel<D, true>(out.data(), lse.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale, scale * kLog2e, causal);
      else
        fwd_kernel<D, false>(out.data(), lse.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale, scale * kLog2e, causal);
    });
    const std::string ftag =
        tag + " fwd " + (path >= 2 ? wgmma_path(groups) : path == 1 ? "cp.async+ldmatrix" : "sync loads");
    const std::vector<float> outf = f32(out);
    check(ftag, "out", outf, outr, 1e-2, 1e-2);
    expect(norm_close(outf, outr, 5e-3), ftag, "out norm");
    check_lse(ftag, lse, lser);
    if (first_out.empty()) {
      first_out = out, first_lse = lse;
    } else {
      expect(std::memcmp(out.data(), first_out.data(), out.size() * sizeof(bf16)) == 0 &&
                 std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)) == 0,
             ftag, "bit-identical to the first path's");
    }
  }

  // With documents, the key tiles wholly before a block's documents (and in
  // the dK/dV kernel the query tiles wholly after them) are skipped: fewer
  // fragment loads (ldmatrix) than the same problem without documents, into
  // scratch outputs.
  if (docs) {
    std::vector<bf16> o2(out.size()), dq2(N * ld_q + 64), dk2(N * ld_kv + 64), dv2(N * ld_kv + 64);
    std::vector<float> l2(lse.size()), dl2(delta.size(), 0.f);
    const float* lse_in = lse.data();
    auto loads = [&](bool with_docs) {
      const long n0 = emu::g_ldmatrix_matrices;
      emu::launch({nqt, (unsigned)Hq, (unsigned)B}, kThreads, [&] {
        if (with_docs)
          fwd_kernel<D, true, true>(o2.data(), l2.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale, scale * kLog2e,
                                    causal, kdoc, key_row0);
        else
          fwd_kernel<D, true>(o2.data(), l2.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale, scale * kLog2e, causal);
      });
      const long n1 = emu::g_ldmatrix_matrices;
      emu::launch({(unsigned)((T + 63) / 64), (unsigned)Hkv, (unsigned)B}, kThreads, [&] {
        if (with_docs)
          dkdv_kernel<D, true, true>(dk2.data(), dv2.data(), doutb.data(), lse_in, dl2.data(), qp, ld_q, kp, vp, ld_kv,
                                     T, Hq, G, scale, scale * kLog2e, causal, kdoc, key_row0);
        else
          dkdv_kernel<D, true>(dk2.data(), dv2.data(), doutb.data(), lse_in, dl2.data(), qp, ld_q, kp, vp, ld_kv, T,
                               Hq, G, scale, scale * kLog2e, causal);
      });
      const long n2 = emu::g_ldmatrix_matrices;
      emu::launch({nqt, (unsigned)Hq, (unsigned)B}, kThreads, [&] {
        if (with_docs)
          dq_kernel<D, true, true>(dq2.data(), doutb.data(), lse_in, dl2.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G,
                                   scale, scale * kLog2e, causal, kdoc, key_row0);
        else
          dq_kernel<D, true>(dq2.data(), doutb.data(), lse_in, dl2.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale,
                             scale * kLog2e, causal);
      });
      return std::array<long, 3>{n1 - n0, n2 - n1, emu::g_ldmatrix_matrices - n2};
    };
    // Documents are at most 70 rows (document_starts): from T = 256 on, the
    // last query block's first document starts at least 2 key tiles in, and
    // the first key block's last reader comes before T, so every kernel must
    // skip; shorter problems may have nothing to skip. Without the causal
    // mask, from T = 65 on, the last query block's documents start past the
    // first key tile (the queries are at positions T .. 2T - 1).
    const auto with = loads(true), without = loads(false);
    const char* names[3] = {"fwd", "dkdv", "dq"};
    const bool must_skip = causal ? T >= 256 : T > 64;
    for (int i = 0; i < 3; ++i)
      expect(must_skip ? with[i] < without[i] : with[i] <= without[i], tag,
             (std::string(names[i]) + ": no tile skipped (" + std::to_string(with[i]) + " ldmatrix against " +
              std::to_string(without[i]) + " without documents)")
                 .c_str());
  }

  // Backward (flash_attention_backward, launch_bwd). A query that sees no
  // key (documents without the causal mask) has lse -inf; ring attention's
  // backward takes the merged lse, finite, so any finite value stands in.
  const std::vector<bf16> outb = b16(std::vector<float>(outr.begin(), outr.end()));
  std::vector<float> lsef(lser.begin(), lser.end());
  for (float& x : lsef)
    if (std::isinf(x)) x = 0.f;
  const size_t rows = N * Hq;
  emu::launch({(unsigned)((rows + kWarps - 1) / kWarps), 1, 1}, kThreads,
              [&] { delta_kernel(delta.data(), doutb.data(), outb.data(), T, Hq, D, rows); });
  // Both tile-load paths, each into freshly poisoned gradients (padding
  // included); the later paths must give the first one's bits.
  // And at D = 64 and 128 the Hopper kernels (dkdv_sm90_kernel,
  // dq_sm90_kernel, launch_bwd_sm90's grids), held to the same tolerances and,
  // under the emulator, to the mma.sync kernels' bits (the same k-steps of 16
  // in the same order); path 3 with 2 warpgroups per block (launch_bwd_sm90's
  // groups: blocks of 128 rows, 256 threads). Documents: the sync loads have
  // none.
  constexpr int kBwdPaths = kPaths == 5 ? 4 : 2;
  std::vector<bf16> first_grads;
  for (int path = 0; path < kBwdPaths; ++path) {
    if (docs && path == 0) continue;
    const bool async = path == 1;
    const int groups = path >= 2 ? path - 1 : 1;
    const std::string btag =
        tag + " bwd " + (path >= 2 ? wgmma_path(groups) : async ? "cp.async+ldmatrix" : "sync loads");
    std::fill(dQb.begin(), dQb.end(), poison_bf16());  // the fused layout's dk, dv too
    std::fill(dKb.begin(), dKb.end(), poison_bf16());  // (both empty in the fused layout)
    std::fill(dVb.begin(), dVb.end(), poison_bf16());
    const unsigned blocks = (unsigned)((T + 64 * groups - 1) / (64 * groups));
    emu::launch({blocks, (unsigned)Hkv, (unsigned)B}, groups * kThreads, [&] {
      if constexpr (kBwdPaths == 4) {
        static_assert(sm90_dkdv_smem_bytes<D, 2>() <= emu::kDynBytes && sm90_dq_smem_bytes<D, 2>() <= emu::kDynBytes);
        auto sm90 = [&]<int kGroups>() {
          if (docs)
            return dkdv_sm90_kernel<D, true, kGroups>(dkp, dvp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp,
                                                      vp, ld_kv, T, Hq, G, scale, scale * kLog2e, causal, kdoc,
                                                      key_row0);
          return dkdv_sm90_kernel<D, false, kGroups>(dkp, dvp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp,
                                                     vp, ld_kv, T, Hq, G, scale, scale * kLog2e, causal);
        };
        if (path == 2) return sm90.template operator()<1>();
        if (path == 3) return sm90.template operator()<2>();
      }
      if (docs)
        dkdv_kernel<D, true, true>(dkp, dvp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq,
                                   G, scale, scale * kLog2e, causal, kdoc, key_row0);
      else if (async)
        dkdv_kernel<D, true>(dkp, dvp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G,
                             scale, scale * kLog2e, causal);
      else
        dkdv_kernel<D, false>(dkp, dvp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G,
                              scale, scale * kLog2e, causal);
    });
    emu::launch({blocks, (unsigned)Hq, (unsigned)B}, groups * kThreads, [&] {
      if constexpr (kBwdPaths == 4) {
        auto sm90 = [&]<int kGroups>() {
          if (docs)
            return dq_sm90_kernel<D, true, kGroups>(dqp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp,
                                                    ld_kv, T, Hq, G, scale, scale * kLog2e, causal, kdoc, key_row0);
          return dq_sm90_kernel<D, false, kGroups>(dqp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp,
                                                   ld_kv, T, Hq, G, scale, scale * kLog2e, causal);
        };
        if (path == 2) return sm90.template operator()<1>();
        if (path == 3) return sm90.template operator()<2>();
      }
      if (docs)
        dq_kernel<D, true, true>(dqp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G,
                                 scale, scale * kLog2e, causal, kdoc, key_row0);
      else if (async)
        dq_kernel<D, true>(dqp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale,
                           scale * kLog2e, causal);
      else
        dq_kernel<D, false>(dqp, doutb.data(), lsef.data(), delta.data(), qp, ld_q, kp, vp, ld_kv, T, Hq, G, scale,
                            scale * kLog2e, causal);
    });
    std::vector<float> dq(N * QD), dk(N * KD), dv(N * KD);
    size_t pad_written = 0;
    for (size_t n = 0; n < N; ++n) {
      for (size_t i = 0; i < QD; ++i) dq[n * QD + i] = __bfloat162float(dqp[n * ld_q + i]);
      for (size_t i = 0; i < KD; ++i) {
        dk[n * KD + i] = __bfloat162float(dkp[n * ld_kv + i]);
        dv[n * KD + i] = __bfloat162float(dvp[n * ld_kv + i]);
      }
      if (layout == 2) {
        for (int i = QD; i < ld_q; ++i) pad_written += __bfloat16_as_ushort(dqp[n * ld_q + i]) != 0xFFFF;
        for (int i = KD; i < ld_kv; ++i)
          pad_written += (__bfloat16_as_ushort(dkp[n * ld_kv + i]) != 0xFFFF) +
                         (__bfloat16_as_ushort(dvp[n * ld_kv + i]) != 0xFFFF);
      }
    }
    for (size_t i = 0; i < 64; ++i) pad_written += __bfloat16_as_ushort(dQb[N * ld_q + i]) != 0xFFFF;
    check(btag, "dq", dq, dqr, 2e-2, 1e-2 * max_abs(dqr) + 1e-3);
    check(btag, "dk", dk, dkr, 2e-2, 1e-2 * max_abs(dkr) + 1e-3);
    check(btag, "dv", dv, dvr, 2e-2, 1e-2 * max_abs(dvr) + 1e-3);
    expect(norm_close(dq, dqr, 1e-2) && norm_close(dk, dkr, 1e-2) && norm_close(dv, dvr, 1e-2), btag,
           "dq/dk/dv norm");
    expect(pad_written == 0, btag, "padding columns (or past the buffer) written");
    std::vector<bf16> grads(dQb);
    if (layout != 1) {
      grads.insert(grads.end(), dKb.begin(), dKb.end());
      grads.insert(grads.end(), dVb.begin(), dVb.end());
    }
    if (first_grads.empty())
      first_grads = grads;
    else
      expect(std::memcmp(grads.data(), first_grads.data(), grads.size() * sizeof(bf16)) == 0, btag,
             "bit-identical to the first path's");
  }
  // The padded tile rows (flash_attention_common.cuh, kPad) keep every
  // ldmatrix of the forward and backward free of bank conflicts.
  expect(emu::g_ldmatrix_matrices > 0 && emu::g_ldmatrix_conflicts == 0, tag,
         ("ldmatrix bank conflicts: " + std::to_string(emu::g_ldmatrix_conflicts) + " of " +
          std::to_string(emu::g_ldmatrix_matrices) + " 8x8 matrices")
             .c_str());
  done(tag);
}

// merge_values_kernel and merge_lse_kernel (attention_merge) vs the same merge in double: a running
// accumulator (some rows still empty, -inf) and a block (some rows it does not
// reach, -inf). out/acc: rtol 1e-5, atol 1e-6; lse: rtol 1e-6, atol 1e-6.
void run_attention_merge() {
  const int B = 2, T = 37, Hq = 3, D = 16;
  const std::string tag = "attention_merge B=2 T=37 Hq=3 D=16";
  const size_t rows = (size_t)B * Hq * T, n = rows * D;
  std::vector<float> acc = randn(n, 2001), acc_lse = randn(rows, 2002), lse = randn(rows, 2003);
  const std::vector<bf16> out = b16(randn(n, 2004));
  for (size_t r = 0; r < rows; r += 5) acc_lse[r] = -INFINITY;
  for (size_t r = 0; r < rows; r += 7) lse[r] = -INFINITY;
  std::vector<double> want(acc.begin(), acc.end()), want_lse(acc_lse.begin(), acc_lse.end());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t r = ((size_t)b * Hq + h) * T + t, at = (((size_t)b * T + t) * Hq + h) * D;
        const double pl = lse[r], al = acc_lse[r];
        if (pl == -INFINITY) continue;
        if (al == -INFINITY) {
          for (int d = 0; d < D; ++d) want[at + d] = __bfloat162float(out[at + d]);
          want_lse[r] = pl;
          continue;
        }
        const double m = std::max(al, pl), merged = m + std::log(std::exp(al - m) + std::exp(pl - m));
        for (int d = 0; d < D; ++d)
          want[at + d] = std::exp(al - merged) * acc[at + d] + std::exp(pl - merged) * __bfloat162float(out[at + d]);
        want_lse[r] = merged;
      }
  // attention_merge's two launches: values (a thread per element), then lse (a thread per row).
  emu::launch({(unsigned)((rows * D + 255) / 256), 1, 1}, 256,
              [&] { merge_values_kernel(acc.data(), acc_lse.data(), out.data(), lse.data(), T, Hq, D, rows * D); });
  emu::launch({(unsigned)((rows + 255) / 256), 1, 1}, 256, [&] { merge_lse_kernel(acc_lse.data(), lse.data(), rows); });
  check(tag, "acc", acc, want, 1e-5, 1e-6);
  std::vector<float> got_lse = acc_lse;
  size_t inf_mismatch = 0;
  for (size_t r = 0; r < rows; ++r)
    if (std::isinf(want_lse[r]) || std::isinf(got_lse[r])) {
      inf_mismatch += want_lse[r] != got_lse[r];
      got_lse[r] = 0, want_lse[r] = 0;
    }
  expect(inf_mismatch == 0, tag, "rows reached by no block must stay -inf");
  check(tag, "lse", got_lse, want_lse, 1e-6, 1e-6);
  done(tag);
}

}  // namespace

// A subset of tests/kernels/cuda/test_flash_attention.cpp's sweep (all of it takes minutes here):
// MHA and GQA (Hkv 4, 2, 1), head dims 16/32/64/128, T = 1, a partial tile
// (37, 70) and more than two tiles (130), the three layouts; one peaked softmax.
void run_flash_attention() {
  run<64>(2, 130, 4, 4, 0, 1000, 1.0f);
  run<64>(2, 130, 4, 2, 1, 1010, 1.0f);
  run<64>(2, 37, 4, 1, 2, 1020, 1.0f);
  run<64>(2, 1, 4, 2, 0, 1030, 1.0f);
  run<128>(2, 70, 4, 2, 2, 1040, 1.0f);
  run<128>(1, 37, 4, 4, 1, 1050, 1.0f);
  run<32>(2, 130, 4, 1, 1, 1060, 1.0f);
  run<16>(2, 37, 4, 2, 0, 1070, 1.0f);
  run<64>(1, 130, 4, 2, 1, 55, 4.0f);  // peaked softmax (qk scale 4)
  // Without the causal mask: a partial last tile for keys and queries, GQA.
  run<64>(1, 70, 4, 2, 1, 1080, 1.0f, false);
  run<128>(1, 130, 4, 1, 0, 1085, 1.0f, false);
  run<16>(2, 37, 4, 2, 0, 1090, 1.0f, false);
  // With document masks: several tiles, GQA and MQA, every head dim, the three layouts.
  run<64>(2, 130, 4, 2, 1, 1100, 1.0f, true, true);
  run<128>(1, 130, 4, 1, 2, 1110, 1.0f, true, true);
  run<32>(2, 70, 4, 4, 0, 1120, 1.0f, true, true);
  run<16>(2, 130, 4, 2, 1, 1130, 1.0f, true, true);
  run<32>(1, 300, 4, 2, 0, 1140, 1.0f, true, true);  // 5 tiles: many skipped before a block's documents
  run<64>(1, 300, 4, 2, 0, 1145, 1.0f, true, true);  // the same with the Hopper kernels too
  // Documents in ring attention's block of an earlier chunk (no causal mask,
  // key_row0 = -T): most queries see none of the keys.
  run<64>(1, 70, 4, 2, 1, 1150, 1.0f, false, true);
  run<128>(2, 130, 4, 1, 0, 1160, 1.0f, false, true);
  run<16>(2, 37, 4, 2, 2, 1170, 1.0f, false, true);
  run_attention_merge();
}

}  // namespace simt
