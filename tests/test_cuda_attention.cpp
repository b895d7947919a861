// CUDA flash attention (kernels/cuda/flash_attention_*.cu) against the CPU
// attention (kernels/cpu attention_forward / attention_backward) run in double
// on the same bf16-rounded inputs. Covers MHA and GQA (Hq / Hkv = 1, 2, 4),
// every supported head_dim, sequence lengths that are not multiples of the
// 64-row tiles, B = 2, and three memory layouts for Q/K/V and dQ/dK/dV:
// contiguous, a fused [N, (Hq + 2 Hkv) D] projection buffer, and padded rows
// (ld > H*D, whose padding must stay untouched). Every output buffer starts
// NaN-poisoned, so an element a kernel forgets to write fails the comparison.
//
// Tolerances (inputs ~N(0, 1); all sums in fp32, so the error budget is the
// bf16 roundings):
//  - out (bf16): rtol 1e-2, atol 1e-2, and ||err|| <= 5e-3 ||ref||. out is a
//    convex combination of V rows (|v| < 5); its bf16 store costs 2^-9 = 0.2%
//    relative and P enters the P V product rounded to bf16 (another <= 0.2% per
//    weight, random in sign). fp32 accumulation adds ~1e-6.
//  - lse (fp32): rtol 1e-5, atol 2e-4. Scores are sums of exact bf16 products
//    in fp32 and exp2f/logf are within 2 ulp, so the error is ~1e-6 absolute
//    for |lse| < 10 (~1e-5 for the peaked test, |lse| ~ 50).
//  - dq, dk, dv (bf16): rtol 2e-2, atol 1e-2 * max|ref| + 1e-3, and
//    ||err|| <= 1e-2 ||ref|| (2e-2 for the peaked softmax). Besides the 0.2%
//    bf16 store, P (for dV) and dS (for dQ, dK) are rounded to bf16 before
//    the MMAs that consume them and delta = rowsum(dO * O) reads the bf16 O.
//    A gradient element is a sum over up to T such terms whose rows of dS sum
//    to zero, so elements that cancel to ~0 carry an error relative to the
//    tensor's largest terms, not to themselves: hence the max-scaled atol
//    (+1e-3 for T = 1, where dq = dk = 0 exactly and only fp32 rounding of
//    dP - delta remains).
// An indexing or masking bug gives O(1) relative errors, far outside these.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;

constexpr uint16_t kPoison = 0xFFFF;  // DeviceBuffer's fill: a NaN bf16

struct Shape {
  int B, T, Hq, Hkv, D;
  size_t rows() const { return static_cast<size_t>(B) * T; }
  size_t qd() const { return static_cast<size_t>(Hq) * D; }
  size_t kd() const { return static_cast<size_t>(Hkv) * D; }
  size_t lse_size() const { return static_cast<size_t>(B) * Hq * T; }
};

enum class Layout { kContiguous, kFused, kPadded };
const char* name(Layout l) {
  return l == Layout::kContiguous ? "contiguous" : (l == Layout::kFused ? "fused qkv" : "padded rows");
}

std::string describe(const Shape& s, Layout l) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " Hq=" + std::to_string(s.Hq) +
         " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D) + " layout=" + name(l);
}

// Inputs (bf16-rounded, contiguous [B, T, H, D]) and the double reference.
struct Problem {
  Shape s;
  std::vector<float> q, k, v, dout;
  std::vector<double> out, lse, dq, dk, dv;
};

Problem make_problem(const Shape& s, uint64_t seed, float qk_scale = 1.0f) {
  Problem p{s, random_bf16_values(s.rows() * s.qd(), seed + 1, qk_scale),
            random_bf16_values(s.rows() * s.kd(), seed + 2, qk_scale), random_bf16_values(s.rows() * s.kd(), seed + 3),
            random_bf16_values(s.rows() * s.qd(), seed + 4), {}, {}, {}, {}, {}};
  const std::vector<double> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()), v(p.v.begin(), p.v.end()),
      dout(p.dout.begin(), p.dout.end());
  std::vector<double> att(static_cast<size_t>(s.B) * s.Hq * s.T * s.T), datt(att.size());
  p.out.assign(q.size(), 0.0);
  kvs::cpu::attention_forward<double>(p.out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.Hq, s.Hkv,
                                      s.D);
  p.dq.assign(q.size(), 0.0);  // the CPU backward accumulates
  p.dk.assign(k.size(), 0.0);
  p.dv.assign(v.size(), 0.0);
  kvs::cpu::attention_backward<double>(p.dq.data(), p.dk.data(), p.dv.data(), datt.data(), dout.data(), q.data(),
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

DeviceQKV upload_qkv(const Problem& p, Layout layout) {
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
std::vector<float> download_strided(const bf16* dev, size_t N, size_t width, int ld, size_t* untouched = nullptr) {
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

std::vector<float> to_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// ||got - want|| <= rel * ||want|| + 1e-3 sqrt(n)  (the floor covers all-zero references).
::testing::AssertionResult norm_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
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

void expect_forward_matches(const Problem& p, Layout layout) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, layout));
  DeviceQKV d = upload_qkv(p, layout);
  DeviceBuffer<bf16> out(s.rows() * s.qd());
  DeviceBuffer<float> lse(s.lse_size());
  kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                              nullptr);
  const std::vector<float> got_out = to_f32(out.download()), got_lse = lse.download();
  EXPECT_TRUE(all_close(got_out, to_float(p.out), 1e-2, 1e-2)) << "out";
  EXPECT_TRUE(norm_close(got_out, p.out, 5e-3)) << "out";
  EXPECT_TRUE(all_close(got_lse, to_float(p.lse), 1e-5, 2e-4)) << "lse";
}

// The backward from the reference out (bf16-rounded) and lse (fp32), so that
// a failure here points at the backward kernels only.
void expect_backward_matches(const Problem& p, Layout layout, double norm_rel = 1e-2) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, layout));
  DeviceQKV d = upload_qkv(p, layout);
  DeviceBuffer<bf16> out(to_bf16(to_float(p.out))), dout(to_bf16(p.dout));
  DeviceBuffer<float> lse(to_float(p.lse));
  DeviceBuffer<float> scratch(kc::flash_attention_backward_scratch_floats(s.B, s.T, s.Hq, s.D));
  kc::flash_attention_backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B,
                               s.T, s.Hq, s.Hkv, s.D, scratch.get(), nullptr);
  size_t untouched = 0;
  size_t* pad = layout == Layout::kPadded ? &untouched : nullptr;
  const std::vector<float> dq = download_strided(d.dq, s.rows(), s.qd(), d.ld_q, pad);
  const std::vector<float> dk = download_strided(d.dk, s.rows(), s.kd(), d.ld_kv, pad);
  const std::vector<float> dv = download_strided(d.dv, s.rows(), s.kd(), d.ld_kv, pad);
  EXPECT_TRUE(all_close(dq, to_float(p.dq), 2e-2, 1e-2 * max_abs(p.dq) + 1e-3)) << "dq";
  EXPECT_TRUE(all_close(dk, to_float(p.dk), 2e-2, 1e-2 * max_abs(p.dk) + 1e-3)) << "dk";
  EXPECT_TRUE(all_close(dv, to_float(p.dv), 2e-2, 1e-2 * max_abs(p.dv) + 1e-3)) << "dv";
  EXPECT_TRUE(norm_close(dq, p.dq, norm_rel)) << "dq";
  EXPECT_TRUE(norm_close(dk, p.dk, norm_rel)) << "dk";
  EXPECT_TRUE(norm_close(dv, p.dv, norm_rel)) << "dv";
  EXPECT_EQ(untouched, 0u) << "padding columns of dq/dk/dv were written";
}

// The sweep shared by the forward and backward tests: every head_dim x
// sequence length x GQA ratio, B = 2, Hq = 4, the three layouts in rotation.
template <class F>
void for_each_case(F&& f) {
  int i = 0;
  for (int D : {16, 32, 64, 128})
    for (int T : {1, 37, 64, 130, 257})
      for (int Hkv : {4, 2, 1}) {
        const Layout layout = static_cast<Layout>(i % 3);
        f(make_problem(Shape{2, T, 4, Hkv, D}, 1000 + 10 * i), layout);
        ++i;
      }
}

TEST(CudaAttention, ForwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for_each_case([](const Problem& p, Layout l) { expect_forward_matches(p, l); });
}

TEST(CudaAttention, BackwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for_each_case([](const Problem& p, Layout l) { expect_backward_matches(p, l); });
}

// Many tiles per row, an MQA group of 8 query heads per KV head, head_dim 128.
TEST(CudaAttention, LongSequenceMqa) {
  KVS_REQUIRE_GPU();
  const Problem p = make_problem(Shape{2, 700, 8, 1, 128}, 77);
  expect_forward_matches(p, Layout::kFused);
  expect_backward_matches(p, Layout::kPadded);
}

// Scores with a standard deviation of ~16: the online softmax's running max
// changes by large steps between key tiles and most probabilities underflow.
// dS rows sum to zero, and with a peaked P the gradients cancel more, so the
// aggregate bound on dq/dk/dv is 2e-2 here (see the top of the file).
TEST(CudaAttention, PeakedSoftmax) {
  KVS_REQUIRE_GPU();
  const Problem p = make_problem(Shape{2, 257, 4, 2, 64}, 55, 4.0f);
  expect_forward_matches(p, Layout::kFused);
  expect_backward_matches(p, Layout::kFused, 2e-2);
}

// Forward then backward twice on the same inputs (outputs re-poisoned in
// between): the results must be bit-identical (no atomics, fixed order).
TEST(CudaAttention, ForwardAndBackwardAreDeterministic) {
  KVS_REQUIRE_GPU();
  for (const Shape s : {Shape{2, 257, 8, 2, 64}, Shape{2, 200, 4, 1, 128}, Shape{3, 130, 4, 4, 32}}) {
    SCOPED_TRACE(describe(s, Layout::kFused));
    Problem p;
    p.s = s;
    p.q = random_bf16_values(s.rows() * s.qd(), 5);
    p.k = random_bf16_values(s.rows() * s.kd(), 6);
    p.v = random_bf16_values(s.rows() * s.kd(), 7);
    p.dout = random_bf16_values(s.rows() * s.qd(), 8);
    DeviceQKV d = upload_qkv(p, Layout::kFused);
    DeviceBuffer<bf16> out(s.rows() * s.qd()), dout(to_bf16(p.dout));
    DeviceBuffer<float> lse(s.lse_size());
    DeviceBuffer<float> scratch(kc::flash_attention_backward_scratch_floats(s.B, s.T, s.Hq, s.D));
    std::vector<bf16> first_out, first_dqkv;
    std::vector<float> first_lse;
    for (int run = 0; run < 2; ++run) {
      out.poison();
      lse.poison();
      d.dqb->poison();
      kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                                  nullptr);
      kc::flash_attention_backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv,
                                   s.B, s.T, s.Hq, s.Hkv, s.D, scratch.get(), nullptr);
      std::vector<bf16> o = out.download(), g = d.dqb->download();
      std::vector<float> l = lse.download();
      const size_t unwritten = std::count_if(g.begin(), g.end(), [](bf16 x) { return std::isnan(__bfloat162float(x)); });
      EXPECT_EQ(unwritten, 0u) << "elements of dq/dk/dv not written (run " << run << ")";
      if (run == 0) {
        first_out = std::move(o);
        first_dqkv = std::move(g);
        first_lse = std::move(l);
      } else {
        EXPECT_EQ(0, std::memcmp(o.data(), first_out.data(), o.size() * sizeof(bf16))) << "out differs";
        EXPECT_EQ(0, std::memcmp(l.data(), first_lse.data(), l.size() * sizeof(float))) << "lse differs";
        EXPECT_EQ(0, std::memcmp(g.data(), first_dqkv.data(), g.size() * sizeof(bf16))) << "dq/dk/dv differ";
      }
    }
  }
}

TEST(CudaAttention, RejectsUnsupportedArguments) {
  KVS_REQUIRE_GPU();
  DeviceBuffer<bf16> buf(4096);
  DeviceBuffer<float> lse(256);
  bf16* p = buf.get();
  // head_dim 48 is not instantiated
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 96, p, p, 96, 1, 8, 2, 2, 48, nullptr), kvs::Error);
  // Hq not a multiple of Hkv
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 96, p, p, 64, 1, 8, 3, 2, 32, nullptr), kvs::Error);
  // a row stride that breaks the 16-byte loads
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 68, p, p, 64, 1, 8, 2, 2, 32, nullptr), kvs::Error);
  // a misaligned base pointer
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p + 1, 64, p, p, 64, 1, 8, 2, 2, 32, nullptr), kvs::Error);
}

}  // namespace
#endif  // KVS_CUDA
