// CUDA elementwise and row kernels (conversion, embedding, RMSNorm, KV shift +
// RoPE, SwiGLU) against the CPU reference ops, run in double on the same
// bf16-rounded inputs. Outputs start poisoned (NaN), so an element a kernel
// forgets shows up; reductions are also checked for bitwise determinism.
//
// Tolerances. A bf16 output is an fp32 result rounded once: within half a bf16
// ulp (2^-9 relative) of the exact value plus fp32 noise, so rtol 1e-2 (about
// 2.5 ulp) with a small atol for results near zero (kBf16Rtol, kBf16Atol). fp32
// reductions (dwte, dw, rstd, dcoef) are compared much tighter, per test.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using FVec = std::vector<float>;
using DVec = std::vector<double>;

constexpr double kBf16Rtol = 1e-2, kBf16Atol = 1e-4;

DVec to_double(const FVec& v) { return DVec(v.begin(), v.end()); }
FVec to_float(const DVec& v) { return FVec(v.begin(), v.end()); }
FVec download_f32(const DeviceBuffer<bf16>& b) { return to_f32(b.download()); }

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
uint16_t bits(bf16 x) {
  uint16_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
std::vector<int32_t> random_tokens(int N, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> t(N);
  for (auto& x : t) x = d(g);
  return t;
}
FVec random_uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  FVec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// ---------------------------------------------------------------- conversion

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

// ---------------------------------------------------------------- embedding

struct EmbShape {
  int N, C, V;
};
const EmbShape kEmbShapes[] = {{1, 8, 3}, {7, 5, 11}, {33, 24, 50}, {64, 768, 100}, {5, 1001, 7}, {300, 64, 4}};

TEST(CudaEmbedding, ForwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kEmbShapes) {
    SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " V " << s.V);
    const auto tokens = random_tokens(s.N, s.V, 1 + s.N);
    const FVec wte = random_bf16_values((size_t)s.V * s.C, 2 + s.C);
    FVec want((size_t)s.N * s.C);
    kvs::cpu::embedding_forward<float>(want.data(), tokens.data(), wte.data(), s.N, s.C);
    DeviceBuffer<int32_t> d_tokens(tokens);
    DeviceBuffer<bf16> d_wte(to_bf16(wte)), d_out((size_t)s.N * s.C);
    kc::embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), s.N, s.C, 0);
    EXPECT_TRUE(all_close(download_f32(d_out), want, 0.0, 0.0));  // a copy: exact
  }
}

// The plan is a host function: this test runs without a GPU too.
TEST(CudaEmbedding, PlanGroupsPositionsByTokenInOrder) {
  for (const auto& [N, V] : std::vector<std::pair<int, int>>{{1, 1}, {10, 3}, {257, 40}, {1000, 50000}, {4096, 2}}) {
    SCOPED_TRACE(testing::Message() << "N " << N << " V " << V);
    const auto tokens = random_tokens(N, V, 7 + N);
    std::map<int32_t, std::vector<int32_t>> groups;  // brute force: ordered by token, positions ascending
    for (int n = 0; n < N; ++n) groups[tokens[n]].push_back(n);
    std::vector<int32_t> uniq(N, -7), offsets(N + 1, -7), positions(N, -7);
    const int U = kc::embedding_backward_plan(tokens.data(), N, uniq.data(), offsets.data(), positions.data());
    ASSERT_EQ(U, (int)groups.size());
    int u = 0;
    for (const auto& [tok, pos] : groups) {
      ASSERT_EQ(uniq[u], tok);
      ASSERT_EQ(offsets[u + 1] - offsets[u], (int)pos.size());
      for (size_t i = 0; i < pos.size(); ++i) ASSERT_EQ(positions[offsets[u] + i], pos[i]);
      ++u;
    }
    EXPECT_EQ(offsets[0], 0);
    EXPECT_EQ(offsets[U], N);
  }
  int32_t offsets0 = -7;
  EXPECT_EQ(kc::embedding_backward_plan(nullptr, 0, nullptr, &offsets0, nullptr), 0);
  EXPECT_EQ(offsets0, 0);
}

// dwte starts from random values (the kernel adds), rows of absent tokens
// stay bit-identical. Tolerance: each dwte element is an fp32 sum of at most
// N bf16 values of order 1 plus the initial value: rtol/atol 1e-5.
TEST(CudaEmbedding, BackwardMatchesCpuAddsIntoDwteAndIsDeterministic) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kEmbShapes) {
    SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " V " << s.V);
    const int V = s.V + 3;  // tokens V .. V + 2 never occur
    const auto tokens = random_tokens(s.N, s.V, 3 + s.N);
    const FVec dout = random_bf16_values((size_t)s.N * s.C, 4 + s.C);
    const FVec dwte0 = random_uniform((size_t)V * s.C, 5 + s.C, -1.0f, 1.0f);
    DVec want = to_double(dwte0);
    kvs::cpu::embedding_backward<double>(want.data(), to_double(dout).data(), tokens.data(), s.N, s.C);

    std::vector<int32_t> uniq(s.N), offsets(s.N + 1), positions(s.N);
    const int U = kc::embedding_backward_plan(tokens.data(), s.N, uniq.data(), offsets.data(), positions.data());
    uniq.resize(U);
    offsets.resize(U + 1);
    DeviceBuffer<int32_t> d_uniq(uniq), d_offsets(offsets), d_positions(positions);
    DeviceBuffer<bf16> d_dout(to_bf16(dout));
    std::vector<FVec> runs;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer<float> d_dwte(dwte0);
      kc::embedding_backward(d_dwte.get(), d_dout.get(), d_uniq.get(), d_offsets.get(), d_positions.get(), U, s.C,
                             0);
      runs.push_back(d_dwte.download());
    }
    EXPECT_TRUE(all_close(runs[0], to_float(want), 1e-5, 1e-5));
    EXPECT_TRUE(same_bits(runs[0], runs[1]));
    for (size_t i = (size_t)s.V * s.C; i < (size_t)V * s.C; ++i) ASSERT_EQ(runs[0][i], dwte0[i]);
  }
}

// ---------------------------------------------------------------- RMSNorm

struct RowShape {
  int N, C;
};
// C = 2051 (odd: scalar path, 2 columns per thread), 8200 (vector path, more
// 8-column chunks than 1024 threads).
const RowShape kRmsShapes[] = {{1, 8}, {5, 37}, {16, 768}, {3, 2051}, {2, 8200}};
constexpr float kEps = 1e-5f;

FVec random_weight(int C, uint64_t seed) {
  FVec w = random_bf16_values(C, seed, 0.2f);
  for (auto& x : w) x += 1.0f;
  return w;
}

// resid_out must be exactly bf16(a + b) (fp32 add, one rounding), out within a
// bf16 tolerance of the double RMSNorm of that stored sum, rstd (fp32) rtol 1e-5.
TEST(CudaRmsNorm, ForwardMatchesCpuWithAndWithoutResidual) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kRmsShapes) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: no b; 1: resid_out separate; 2: resid_out aliases a
      SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " mode " << mode);
      const size_t n = (size_t)s.N * s.C;
      const FVec a = random_bf16_values(n, 10 + s.C), b = random_bf16_values(n, 20 + s.C), w = random_weight(s.C, 30);
      FVec x(n);
      for (size_t i = 0; i < n; ++i) x[i] = mode == 0 ? a[i] : bf16_round(a[i] + b[i]);
      DVec want(n), want_rstd(s.N);
      kvs::cpu::rmsnorm_forward<double>(want.data(), want_rstd.data(), to_double(x).data(), to_double(w).data(), s.N,
                                        s.C, kEps);

      DeviceBuffer<bf16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_resid(n), d_out(n);
      DeviceBuffer<float> d_w(w), d_rstd(s.N);
      bf16* resid = mode == 2 ? d_a.get() : d_resid.get();
      kc::residual_rmsnorm_forward(resid, d_out.get(), d_rstd.get(), d_a.get(), mode ? d_b.get() : nullptr, d_w.get(),
                                   s.N, s.C, kEps, 0);
      if (mode) {
        EXPECT_TRUE(all_close(mode == 2 ? download_f32(d_a) : download_f32(d_resid), x, 0.0, 0.0));
      }
      EXPECT_TRUE(all_close(download_f32(d_out), to_float(want), kBf16Rtol, kBf16Atol));
      EXPECT_TRUE(all_close(d_rstd.download(), to_float(want_rstd), 1e-5, 0.0));
    }
  }
}

// dinp: bf16 tolerance (the result is of order 1; atol 1e-3 covers fp32
// cancellation between r w g and k x). dw: fp32 sums over the rows of order-1
// terms, rtol/atol 1e-4. Scratch starts poisoned: it need not be zeroed.
TEST(CudaRmsNorm, BackwardMatchesCpuWithResidualGradientAndAliasing) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kRmsShapes) {
    for (int mode = 0; mode < 3; ++mode) {  // 0: no dresid; 1: dresid separate; 2: dinp aliases dresid
      SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " mode " << mode);
      const size_t n = (size_t)s.N * s.C;
      const FVec x = random_bf16_values(n, 40 + s.C), dout = random_bf16_values(n, 50 + s.C);
      const FVec dresid = random_bf16_values(n, 60 + s.C), w = random_weight(s.C, 70);
      const FVec dw0 = random_uniform(s.C, 80, -1.0f, 1.0f);
      FVec out(n), rstd(s.N);
      kvs::cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, kEps);

      DVec want_dx = mode ? to_double(dresid) : DVec(n, 0.0), want_dw = to_double(dw0);
      kvs::cpu::rmsnorm_backward<double>(want_dx.data(), want_dw.data(), to_double(dout).data(), to_double(x).data(),
                                         to_double(w).data(), to_double(rstd).data(), s.N, s.C);

      DeviceBuffer<bf16> d_x(to_bf16(x)), d_dout(to_bf16(dout)), d_dresid(to_bf16(dresid)), d_dx(n);
      DeviceBuffer<float> d_w(w), d_rstd(rstd), d_dw(dw0), d_scratch(kc::rmsnorm_backward_scratch_floats(s.N, s.C));
      bf16* dx = mode == 2 ? d_dresid.get() : d_dx.get();
      kc::rmsnorm_backward(dx, d_dw.get(), d_dout.get(), mode ? d_dresid.get() : nullptr, d_x.get(), d_w.get(),
                           d_rstd.get(), s.N, s.C, d_scratch.get(), 0);
      EXPECT_TRUE(all_close(mode == 2 ? download_f32(d_dresid) : download_f32(d_dx), to_float(want_dx), kBf16Rtol,
                            1e-3));
      EXPECT_TRUE(all_close(d_dw.download(), to_float(want_dw), 1e-4, 1e-4));
    }
  }
}

// Many rows (several per block of the backward): dw and dinp bitwise equal
// over two runs, dw within fp32 tolerance of the double sum over 6000 rows
// (rtol 1e-4, atol 1e-3). Also the dw-only call (dinp null).
TEST(CudaRmsNorm, BackwardIsBitwiseDeterministicOverManyRows) {
  KVS_REQUIRE_GPU();
  const int N = 6000, C = 768;
  const size_t n = (size_t)N * C;
  const FVec x = random_bf16_values(n, 90), dout = random_bf16_values(n, 91), w = random_weight(C, 92);
  FVec out(n), rstd(N);
  kvs::cpu::rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  DVec want_dw(C, 0.0);
  kvs::cpu::rmsnorm_backward<double>(nullptr, want_dw.data(), to_double(dout).data(), to_double(x).data(),
                                     to_double(w).data(), to_double(rstd).data(), N, C);
  DeviceBuffer<bf16> d_x(to_bf16(x)), d_dout(to_bf16(dout));
  DeviceBuffer<float> d_w(w), d_rstd(rstd), d_scratch(kc::rmsnorm_backward_scratch_floats(N, C));
  std::vector<FVec> dws;
  std::vector<std::vector<bf16>> dxs;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<bf16> d_dx(n);
    DeviceBuffer<float> d_dw(C);
    d_dw.zero();
    kc::rmsnorm_backward(run < 2 ? d_dx.get() : nullptr, d_dw.get(), d_dout.get(), nullptr, d_x.get(), d_w.get(),
                         d_rstd.get(), N, C, d_scratch.get(), 0);
    dws.push_back(d_dw.download());
    if (run < 2) dxs.push_back(d_dx.download());
  }
  EXPECT_TRUE(all_close(dws[0], to_float(want_dw), 1e-4, 1e-3));
  EXPECT_TRUE(same_bits(dws[0], dws[1]));
  EXPECT_TRUE(same_bits(dws[0], dws[2]));
  EXPECT_TRUE(same_bits(dxs[0], dxs[1]));
}

// ---------------------------------------------------------------- SwiGLU

const RowShape kSwigluShapes[] = {{1, 1}, {3, 13}, {8, 64}, {5, 1000}, {2, 4104}};

void split_gate_up(const FVec& gu, int N, int F, DVec& gate, DVec& up) {
  gate.resize((size_t)N * F);
  up.resize((size_t)N * F);
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < F; ++j) {
      gate[(size_t)r * F + j] = gu[(size_t)r * 2 * F + j];
      up[(size_t)r * F + j] = gu[(size_t)r * 2 * F + F + j];
    }
}

TEST(CudaSwiGLU, ForwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for (const auto& s : kSwigluShapes) {
    SCOPED_TRACE(testing::Message() << "N " << s.N << " F " << s.C);
    const int N = s.N, F = s.C;
    const FVec gu = random_bf16_values((size_t)N * 2 * F, 100 + F, 2.0f);
    DVec gate, up, want((size_t)N * F);
    split_gate_up(gu, N, F, gate, up);
    kvs::cpu::swiglu_forward<double>(want.data(), gate.data(), up.data(), want.size());
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
    DVec gate, up, dgate((size_t)N * F, 0.0), dup((size_t)N * F, 0.0);
    split_gate_up(gu, N, F, gate, up);
    kvs::cpu::swiglu_backward<double>(dgate.data(), dup.data(), to_double(dout).data(), gate.data(), up.data(),
                                      dgate.size());
    FVec want((size_t)N * 2 * F);
    for (int r = 0; r < N; ++r)
      for (int j = 0; j < F; ++j) {
        want[(size_t)r * 2 * F + j] = (float)dgate[(size_t)r * F + j];
        want[(size_t)r * 2 * F + F + j] = (float)dup[(size_t)r * F + j];
      }
    DeviceBuffer<bf16> d_gu(to_bf16(gu)), d_dout(to_bf16(dout)), d_dgu((size_t)N * 2 * F);
    kc::swiglu_backward(d_dgu.get(), d_dout.get(), d_gu.get(), N, F, 0);
    EXPECT_TRUE(all_close(download_f32(d_dgu), want, kBf16Rtol, kBf16Atol));
  }
}

// ---------------------------------------------------------------- KV shift + RoPE
//
// x and dx live in rows of stride in_ld = H*D + in_pad at column in_off (as K
// inside the fused QKV projection); y and dy in rows of stride H*D + out_pad
// at column 0. The CPU ops take contiguous [B, T, H, D], so the tests gather.

struct ShiftCase {
  int B, T, H, D, W;
  bool coef, rope;
  int in_pad, in_off, out_pad;
};
const ShiftCase kShiftCases[] = {
    {2, 5, 3, 16, 1, true, true, 0, 0, 0},        // vector path, contiguous
    {3, 37, 2, 64, 2, true, true, 24, 8, 8},      // vector path, strided, 2 tiles of 32
    {2, 70, 4, 128, 3, true, true, 8, 0, 0},      // 16-row tiles: 5 per sequence
    {2, 40, 2, 64, 1, true, true, 384, 256, 0},   // K of a fused [N, 4*64 + 2*2*64] QKV
    {2, 40, 2, 64, 1, true, false, 0, 0, 8},      // shift only
    {2, 33, 3, 32, 0, false, true, 32, 16, 0},    // RoPE only (the query path)
    {2, 9, 2, 6, 2, true, true, 3, 1, 5},         // D = 6: scalar path, odd strides
    {3, 2, 2, 10, 3, true, true, 0, 0, 0},        // T < W: the whole window is history
    {2, 1, 1, 16, 1, true, true, 5, 2, 0},        // T = 1, unaligned rows: scalar path
    {2, 50, 2, 7, 1, true, false, 1, 0, 3},       // odd D without RoPE
    {2, 70, 2, 64, 8, true, true, 0, 0, 0},       // the largest window dcoef supports
    {4, 65, 1, 32, 2, true, true, 0, 0, 0},       // several sequences, tiles of 32: 65 = 2*32 + 1
};

// Rows [B*T, ld] with head h at columns off + h*D: gather to contiguous [B, T, H, D].
DVec gather(const FVec& full, const ShiftCase& c, int ld, int off) {
  DVec out((size_t)c.B * c.T * c.H * c.D);
  for (size_t r = 0; r < (size_t)c.B * c.T; ++r)
    for (int k = 0; k < c.H * c.D; ++k) out[r * c.H * c.D + k] = full[r * ld + off + k];
  return out;
}
// The gathered part of a strided bf16 buffer, and whether every other element still holds the poison.
FVec gather_f32(const std::vector<bf16>& full, const ShiftCase& c, int ld, int off, bool* rest_poisoned) {
  FVec out((size_t)c.B * c.T * c.H * c.D);
  *rest_poisoned = true;
  for (size_t r = 0; r < (size_t)c.B * c.T; ++r)
    for (int k = 0; k < ld; ++k) {
      if (k >= off && k < off + c.H * c.D)
        out[r * c.H * c.D + k - off] = __bfloat162float(full[r * ld + k]);
      else if (bits(full[r * ld + k]) != 0xFFFF)
        *rest_poisoned = false;
    }
  return out;
}

struct ShiftData {
  int in_ld, out_ld;
  FVec x_full, coef, cos, sin;
  DVec x, coef_d, cos_d, sin_d;
};
ShiftData make_shift_data(const ShiftCase& c, uint64_t seed) {
  ShiftData s;
  s.in_ld = c.H * c.D + c.in_pad;
  s.out_ld = c.H * c.D + c.out_pad;
  s.x_full = random_bf16_values((size_t)c.B * c.T * s.in_ld, seed);
  s.x = gather(s.x_full, c, s.in_ld, c.in_off);
  // Coefficients and tables are made even when the case passes null for them
  // (the device buffers are then simply unused).
  s.coef = random_uniform((size_t)c.H * (c.W + 1), seed + 1, -0.5f, 1.0f);
  s.cos.resize((size_t)c.T * std::max(1, c.D / 2));
  s.sin.resize(s.cos.size());
  kvs::cpu::rope_tables<float>(s.cos.data(), s.sin.data(), c.T, c.D, 10000.0);
  s.coef_d = to_double(s.coef);
  s.cos_d = to_double(s.cos);
  s.sin_d = to_double(s.sin);
  return s;
}
std::string describe(const ShiftCase& c) {
  return testing::PrintToString(std::vector<int>{c.B, c.T, c.H, c.D, c.W, c.coef, c.rope, c.in_pad, c.in_off,
                                                 c.out_pad});
}

// y within the bf16 tolerance of the double shift-then-rotate; the columns of
// y outside the heads are never written.
TEST(CudaShiftRope, ForwardMatchesCpuShiftThenRope) {
  KVS_REQUIRE_GPU();
  for (const auto& c : kShiftCases) {
    SCOPED_TRACE("B T H D W coef rope in_pad in_off out_pad = " + describe(c));
    const ShiftData s = make_shift_data(c, 200 + c.T * 7 + c.D);
    const int W = c.coef ? c.W : 0;
    DVec shifted = s.x, want(s.x.size());
    if (c.coef)
      kvs::cpu::kv_shift_forward<double>(shifted.data(), s.x.data(), s.coef_d.data(), c.B, c.T, c.H, c.D, W);
    if (c.rope)
      kvs::cpu::rope_forward<double>(want.data(), shifted.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
    else
      want = shifted;

    DeviceBuffer<bf16> d_x(to_bf16(s.x_full)), d_y((size_t)c.B * c.T * s.out_ld);
    DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
    kc::shift_rope_forward(d_y.get(), s.out_ld, d_x.get() + c.in_off, s.in_ld, c.coef ? d_coef.get() : nullptr,
                           c.rope ? d_cos.get() : nullptr, c.rope ? d_sin.get() : nullptr, c.B, c.T, c.H, c.D, W, 0);
    bool rest_poisoned = false;
    const FVec got = gather_f32(d_y.download(), c, s.out_ld, 0, &rest_poisoned);
    EXPECT_TRUE(all_close(got, to_float(want), kBf16Rtol, kBf16Atol));
    EXPECT_TRUE(rest_poisoned) << "wrote outside the heads' columns";
  }
}

// dx: bf16 tolerance. dcoef (fp32, added into random initial values) is a sum
// of B*T*D products of order 1 through fp32 partials: rtol 1e-5 plus an atol
// of 1e-6 per summed term. Two runs are bitwise equal. Scratch starts poisoned.
TEST(CudaShiftRope, BackwardMatchesCpuAndIsDeterministic) {
  KVS_REQUIRE_GPU();
  for (const auto& c : kShiftCases) {
    SCOPED_TRACE("B T H D W coef rope in_pad in_off out_pad = " + describe(c));
    const ShiftData s = make_shift_data(c, 300 + c.T * 7 + c.D);
    const int W = c.coef ? c.W : 0;
    const FVec dy_full = random_bf16_values((size_t)c.B * c.T * s.out_ld, 400 + c.T);
    const DVec dy = gather(dy_full, c, s.out_ld, 0);
    const FVec dcoef0 = random_uniform((size_t)c.H * (W + 1), 500, -1.0f, 1.0f);

    DVec ds(dy.size(), 0.0), want_dx(dy.size(), 0.0), want_dcoef = to_double(dcoef0);
    if (c.rope)
      kvs::cpu::rope_backward<double>(ds.data(), dy.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
    else
      ds = dy;
    if (c.coef)
      kvs::cpu::kv_shift_backward<double>(want_dx.data(), want_dcoef.data(), ds.data(), s.x.data(), s.coef_d.data(),
                                          c.B, c.T, c.H, c.D, W);
    else
      want_dx = ds;

    DeviceBuffer<bf16> d_x(to_bf16(s.x_full)), d_dy(to_bf16(dy_full));
    DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
    DeviceBuffer<float> d_scratch(kc::shift_rope_backward_scratch_floats(c.B, c.T, c.H, c.D, W));
    std::vector<std::vector<bf16>> dxs;
    std::vector<FVec> dcoefs;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer<bf16> d_dx((size_t)c.B * c.T * s.in_ld);
      DeviceBuffer<float> d_dcoef(dcoef0);
      kc::shift_rope_backward(d_dx.get() + c.in_off, s.in_ld, c.coef ? d_dcoef.get() : nullptr, d_dy.get(), s.out_ld,
                              d_x.get() + c.in_off, s.in_ld, c.coef ? d_coef.get() : nullptr,
                              c.rope ? d_cos.get() : nullptr, c.rope ? d_sin.get() : nullptr, c.B, c.T, c.H, c.D, W,
                              d_scratch.get(), 0);
      dxs.push_back(d_dx.download());
      dcoefs.push_back(d_dcoef.download());
    }
    bool rest_poisoned = false;
    const FVec got_dx = gather_f32(dxs[0], c, s.in_ld, c.in_off, &rest_poisoned);
    EXPECT_TRUE(all_close(got_dx, to_float(want_dx), kBf16Rtol, kBf16Atol));
    EXPECT_TRUE(rest_poisoned) << "wrote outside the heads' columns";
    EXPECT_TRUE(all_close(dcoefs[0], to_float(want_dcoef), 1e-5, 1e-6 * c.B * c.T * c.D));
    EXPECT_TRUE(same_bits(dxs[0], dxs[1]));
    EXPECT_TRUE(same_bits(dcoefs[0], dcoefs[1]));
  }
}

// dcoef null (a frozen shift): dx alone, no scratch needed.
TEST(CudaShiftRope, BackwardWithoutDcoefNeedsNoScratch) {
  KVS_REQUIRE_GPU();
  const ShiftCase c{2, 37, 2, 64, 2, true, true, 0, 0, 0};
  const ShiftData s = make_shift_data(c, 600);
  const FVec dy_full = random_bf16_values((size_t)c.B * c.T * s.out_ld, 601);
  const DVec dy = gather(dy_full, c, s.out_ld, 0);
  DVec ds(dy.size(), 0.0), want_dx(dy.size(), 0.0);
  kvs::cpu::rope_backward<double>(ds.data(), dy.data(), s.cos_d.data(), s.sin_d.data(), c.B, c.T, c.H, c.D);
  kvs::cpu::kv_shift_backward<double>(want_dx.data(), nullptr, ds.data(), s.x.data(), s.coef_d.data(), c.B, c.T, c.H,
                                      c.D, c.W);
  DeviceBuffer<bf16> d_x(to_bf16(s.x_full)), d_dy(to_bf16(dy_full)), d_dx(dy.size());
  DeviceBuffer<float> d_coef(s.coef), d_cos(s.cos), d_sin(s.sin);
  kc::shift_rope_backward(d_dx.get(), s.in_ld, nullptr, d_dy.get(), s.out_ld, d_x.get(), s.in_ld, d_coef.get(),
                          d_cos.get(), d_sin.get(), c.B, c.T, c.H, c.D, c.W, nullptr, 0);
  EXPECT_TRUE(all_close(download_f32(d_dx), to_float(want_dx), kBf16Rtol, kBf16Atol));
}

}  // namespace
#endif  // KVS_CUDA
