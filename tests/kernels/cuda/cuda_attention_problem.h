// The attention problems shared by the CUDA attention tests (our flash
// kernels, test_flash_attention.cpp; cuDNN SDPA, test_cudnn_sdpa.cpp):
// a shape, bf16-rounded random Q/K/V/dO with the double-precision CPU
// reference (out, lse, dq, dk, dv), and the device buffers in one of three
// layouts (contiguous, one fused [N, QD + 2 KD] projection buffer, padded
// rows), dQ/dK/dV with the same strides and NaN-poisoned.
#pragma once
#ifdef KVS_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"

namespace kvs::cuda_test {

constexpr uint16_t kPoison = 0xFFFF;  // DeviceBuffer's fill: a NaN bf16

struct Shape {
  int B, T, Hq, Hkv, D;
  size_t rows() const { return static_cast<size_t>(B) * T; }
  size_t qd() const { return static_cast<size_t>(Hq) * D; }
  size_t kd() const { return static_cast<size_t>(Hkv) * D; }
  size_t lse_size() const { return static_cast<size_t>(B) * Hq * T; }
};

enum class Layout { kContiguous, kFused, kPadded };
inline const char* name(Layout l) {
  return l == Layout::kContiguous ? "contiguous" : (l == Layout::kFused ? "fused qkv" : "padded rows");
}

inline std::string describe(const Shape& s, Layout l) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " Hq=" + std::to_string(s.Hq) +
         " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D) + " layout=" + name(l);
}

// Inputs (bf16-rounded, contiguous [B, T, H, D]) and the double reference.
struct Problem {
  Shape s;
  std::vector<float> q, k, v, dout;
  std::vector<double> out, lse, dq, dk, dv;
};

inline Problem make_problem(const Shape& s, uint64_t seed, float qk_scale = 1.0f) {
  Problem p{s, random_bf16_values(s.rows() * s.qd(), seed + 1, qk_scale),
            random_bf16_values(s.rows() * s.kd(), seed + 2, qk_scale), random_bf16_values(s.rows() * s.kd(), seed + 3),
            random_bf16_values(s.rows() * s.qd(), seed + 4), {}, {}, {}, {}, {}};
  const std::vector<double> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()), v(p.v.begin(), p.v.end()),
      dout(p.dout.begin(), p.dout.end());
  std::vector<double> att(static_cast<size_t>(s.B) * s.Hq * s.T * s.T);
  p.out.assign(q.size(), 0.0);
  kvs::cpu::attention_forward<double>(p.out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.Hq, s.Hkv,
                                      s.D);
  p.dq.assign(q.size(), 0.0);  // the CPU backward accumulates
  p.dk.assign(k.size(), 0.0);
  p.dv.assign(v.size(), 0.0);
  kvs::cpu::attention_backward<double>(p.dq.data(), p.dk.data(), p.dv.data(), dout.data(), q.data(),
                                       k.data(), v.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  // lse[b, h, t] = log sum_{j <= t} exp(<q_t, k_j> / sqrt(D)), straight from the definition.
  p.lse.assign(s.lse_size(), 0.0);
  const int G = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  std::vector<double> sc(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h)
      for (int t = 0; t < s.T; ++t) {
        const double* qr = q.data() + (static_cast<size_t>(b) * s.T + t) * s.qd() + static_cast<size_t>(h) * s.D;
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const double* kr =
              k.data() + (static_cast<size_t>(b) * s.T + j) * s.kd() + static_cast<size_t>(h / G) * s.D;
          double dot = 0;
          for (int d = 0; d < s.D; ++d) dot += qr[d] * kr[d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += std::exp(sc[j] - mx);
        p.lse[(static_cast<size_t>(b) * s.Hq + h) * s.T + t] = mx + std::log(sum);
      }
  return p;
}

// Q/K/V (and dQ/dK/dV with the same strides) on the device in one of the layouts.
struct DeviceQKV {
  int ld_q = 0, ld_kv = 0;
  std::unique_ptr<DeviceBuffer<bf16>> qb, kb, vb, dqb, dkb, dvb;  // kFused: only qb / dqb
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

inline DeviceQKV upload_qkv(const Problem& p, Layout layout) {
  const Shape& s = p.s;
  const size_t N = s.rows(), QD = s.qd(), KD = s.kd();
  DeviceQKV d;
  size_t koff = 0, voff = 0;  // column offsets inside the fused buffer
  if (layout == Layout::kContiguous) {
    d.ld_q = static_cast<int>(QD);
    d.ld_kv = static_cast<int>(KD);
  } else if (layout == Layout::kFused) {
    d.ld_q = d.ld_kv = static_cast<int>(QD + 2 * KD);
    koff = QD;
    voff = QD + KD;
  } else {
    d.ld_q = static_cast<int>(QD + 8);
    d.ld_kv = static_cast<int>(KD + 24);
  }
  // Host images of the strided buffers, padding poisoned like the device buffers.
  std::vector<bf16> qh(N * d.ld_q, __ushort_as_bfloat16(kPoison));
  std::vector<bf16> kh(layout == Layout::kFused ? 0 : N * d.ld_kv, __ushort_as_bfloat16(kPoison)), vh = kh;
  bf16* kdst = layout == Layout::kFused ? qh.data() + koff : kh.data();
  bf16* vdst = layout == Layout::kFused ? qh.data() + voff : vh.data();
  for (size_t n = 0; n < N; ++n) {
    for (size_t i = 0; i < QD; ++i) qh[n * d.ld_q + i] = __float2bfloat16_rn(p.q[n * QD + i]);
    for (size_t i = 0; i < KD; ++i) {
      kdst[n * d.ld_kv + i] = __float2bfloat16_rn(p.k[n * KD + i]);
      vdst[n * d.ld_kv + i] = __float2bfloat16_rn(p.v[n * KD + i]);
    }
  }
  d.qb = std::make_unique<DeviceBuffer<bf16>>(qh);
  d.dqb = std::make_unique<DeviceBuffer<bf16>>(qh.size());
  d.q = d.qb->get();
  d.dq = d.dqb->get();
  if (layout == Layout::kFused) {
    d.k = d.q + koff;
    d.v = d.q + voff;
    d.dk = d.dq + koff;
    d.dv = d.dq + voff;
  } else {
    d.kb = std::make_unique<DeviceBuffer<bf16>>(kh);
    d.vb = std::make_unique<DeviceBuffer<bf16>>(vh);
    d.dkb = std::make_unique<DeviceBuffer<bf16>>(kh.size());
    d.dvb = std::make_unique<DeviceBuffer<bf16>>(vh.size());
    d.k = d.kb->get();
    d.v = d.vb->get();
    d.dk = d.dkb->get();
    d.dv = d.dvb->get();
  }
  return d;
}

// Rows [0, N) x columns [0, width) of a strided device tensor, as floats;
// `untouched` counts padding columns [width, ld) that no longer hold the poison.
inline std::vector<float> download_strided(const bf16* dev, size_t N, size_t width, int ld,
                                           size_t* untouched = nullptr) {
  // A fused-buffer tensor starts at a column offset: copy only up to its last element.
  std::vector<bf16> h((N - 1) * ld + (untouched ? ld : width));
  check(cudaDeviceSynchronize(), "kernel");
  check(cudaMemcpy(h.data(), dev, h.size() * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
  std::vector<float> out(N * width);
  for (size_t n = 0; n < N; ++n) {
    for (size_t i = 0; i < width; ++i) out[n * width + i] = __bfloat162float(h[n * ld + i]);
    if (untouched)  // only for separate (padded) buffers, which hold N * ld elements
      for (size_t i = width; i < static_cast<size_t>(ld); ++i)
        *untouched += __bfloat16_as_ushort(h[n * ld + i]) != kPoison;
  }
  return out;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// ||got - want|| <= rel * ||want|| + 1e-3 sqrt(n)  (the floor covers all-zero references).
inline ::testing::AssertionResult norm_close(const std::vector<float>& got, const std::vector<double>& want,
                                             double rel) {
  double e2 = 0, w2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    e2 += e * e;
    w2 += want[i] * want[i];
  }
  const double err = std::sqrt(e2), bound = rel * std::sqrt(w2) + 1e-3 * std::sqrt(static_cast<double>(want.size()));
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "||err|| = " << err << " > " << bound << " (||ref|| = " << std::sqrt(w2)
                                       << ")";
}

}  // namespace kvs::cuda_test
#endif  // KVS_CUDA
