// CUDA matmul (cuBLASLt), fused cross-entropy, fp64 reductions and the
// multi-tensor AdamW step, each against its CPU counterpart: the kvs::cpu op
// run in double on the same bf16-rounded inputs, a double host sum, or a host
// loop that repeats CpuEngine::adamw_step's float arithmetic. Outputs start
// poisoned (NaN), so an element a kernel forgets to write fails.
//
// Tolerances, by output type:
// - bf16 outputs (matmul activations, dlogits): one bf16 ulp relative (2^-8,
//   i.e. round-to-nearest's half ulp with room for fp32 differences before
//   the rounding), plus a small absolute term for values that cancel.
// - fp32 matmul results (dW): fp32 accumulation in a different order, so the
//   error is bounded relative to mag = sum |a_i b_i| of the element's terms
//   (4e-6 * mag, about 64 fp32 ulps of the largest partial sum).
// - fp32 losses: sum of exp in fp32 over V terms, 2e-5 absolute + 1e-5 relative.
// - fp64 sums: 1e-11 relative to sum |x_i| (order differs from the host's).
// - AdamW: the same float operations in the same order; differences come only
//   from the per-step constants (rounded from float arguments rather than
//   double) and possible FMA contraction by the host compiler, so a few fp32
//   ulps; the bf16 copy must be exactly bf16(master).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using DVec = std::vector<double>;
using FVec = std::vector<float>;

uint16_t bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// |got - want| <= rtol |want| + atol + mtol * mag for every element (mag: the
// sum of the absolute values of the terms that make up the element).
::testing::AssertionResult close_scaled(const FVec& got, const DVec& want, const DVec& mag, double rtol, double atol,
                                        double mtol) {
  if (got.size() != want.size() || got.size() != mag.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " / " << want.size();
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double excess = std::isnan(err) ? 1e300 : err - (rtol * std::fabs(want[i]) + atol + mtol * mag[i]);
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " out of tolerance; worst at " << worst
                                       << ": got " << got[worst] << ", want " << want[worst] << " (mag "
                                       << mag[worst] << ")";
}

DVec abs_of(const DVec& x) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = std::fabs(x[i]);
  return y;
}

// Columns [0, cols) of a [rows, ld] host matrix, contiguous, in double.
DVec unpad(const FVec& x, int rows, int cols, int ld) {
  DVec y(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[size_t(r) * cols + c] = x[size_t(r) * ld + c];
  return y;
}

// ================================================================ matmul

struct MatmulShape {
  int N, C, OC;
  int ld_in, ld_out;  // row strides of inp and of out / dout (>= C and >= OC)
};
std::ostream& operator<<(std::ostream& os, const MatmulShape& s) {
  return os << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " ld_in=" << s.ld_in << " ld_out=" << s.ld_out;
}

class CudaMatmul : public ::testing::TestWithParam<MatmulShape> {};

// out[N, OC] = inp @ W^T with strided inp and out; the padding columns of out
// keep their poison.
TEST_P(CudaMatmul, Forward) {
  KVS_REQUIRE_GPU();
  const auto [N, C, OC, ld_in, ld_out] = GetParam();
  const FVec inp = random_bf16_values(size_t(N) * ld_in, 11), W = random_bf16_values(size_t(OC) * C, 12);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_W(to_bf16(W)), d_out(size_t(N) * ld_out);
  kc::Matmul mm;
  mm.forward(d_out.get(), ld_out, d_inp.get(), ld_in, d_W.get(), N, C, OC, nullptr);
  const std::vector<bf16> out = d_out.download();

  const DVec x = unpad(inp, N, C, ld_in), w(W.begin(), W.end());
  DVec want(size_t(N) * OC), mag(size_t(N) * OC);
  kvs::cpu::matmul_forward<double>(want.data(), x.data(), w.data(), N, C, OC);
  kvs::cpu::matmul_forward<double>(mag.data(), abs_of(x).data(), abs_of(w).data(), N, C, OC);
  FVec got(size_t(N) * OC);
  size_t padding_written = 0;
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) got[size_t(n) * OC + o] = __bfloat162float(out[size_t(n) * ld_out + o]);
    for (int o = OC; o < ld_out; ++o) padding_written += bits(out[size_t(n) * ld_out + o]) != 0xFFFF;
  }
  EXPECT_TRUE(close_scaled(got, want, mag, 1.0 / 256, 1e-6, 4e-6));
  EXPECT_EQ(padding_written, 0u) << "forward wrote outside out's first OC columns";
}

// dinp[N, C] (contiguous, overwritten) = dout @ W with strided dout.
TEST_P(CudaMatmul, BackwardInput) {
  KVS_REQUIRE_GPU();
  const auto [N, C, OC, ld_in, ld_dout] = GetParam();
  (void)ld_in;
  const FVec dout = random_bf16_values(size_t(N) * ld_dout, 21), W = random_bf16_values(size_t(OC) * C, 22);
  DeviceBuffer<bf16> d_dout(to_bf16(dout)), d_W(to_bf16(W)), d_dinp(size_t(N) * C);
  kc::Matmul mm;
  mm.backward_input(d_dinp.get(), d_dout.get(), ld_dout, d_W.get(), N, C, OC, nullptr);
  const FVec got = to_f32(d_dinp.download());

  const DVec dy = unpad(dout, N, OC, ld_dout), w(W.begin(), W.end());
  DVec want(size_t(N) * C, 0.0), mag(size_t(N) * C, 0.0);
  kvs::cpu::matmul_backward<double>(want.data(), nullptr, dy.data(), nullptr, w.data(), N, C, OC);
  kvs::cpu::matmul_backward<double>(mag.data(), nullptr, abs_of(dy).data(), nullptr, abs_of(w).data(), N, C, OC);
  EXPECT_TRUE(close_scaled(got, want, mag, 1.0 / 256, 1e-6, 4e-6));
}

// dW[OC, C] += dout^T @ inp: accumulates into a dW that already holds values,
// with strided dout and inp.
TEST_P(CudaMatmul, BackwardWeightAccumulates) {
  KVS_REQUIRE_GPU();
  const auto [N, C, OC, ld_in, ld_dout] = GetParam();
  const FVec inp = random_bf16_values(size_t(N) * ld_in, 31), dout = random_bf16_values(size_t(N) * ld_dout, 32);
  std::mt19937_64 g(33);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  FVec dW0(size_t(OC) * C);
  for (auto& v : dW0) v = nd(g);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_dout(to_bf16(dout));
  DeviceBuffer<float> d_dW(dW0);
  kc::Matmul mm;
  mm.backward_weight(d_dW.get(), d_dout.get(), ld_dout, d_inp.get(), ld_in, N, C, OC, nullptr);
  const FVec got = d_dW.download();

  const DVec x = unpad(inp, N, C, ld_in), dy = unpad(dout, N, OC, ld_dout);
  DVec want(dW0.begin(), dW0.end()), mag = abs_of(want);
  kvs::cpu::matmul_backward<double>(nullptr, want.data(), dy.data(), x.data(), nullptr, N, C, OC);
  kvs::cpu::matmul_backward<double>(nullptr, mag.data(), abs_of(dy).data(), abs_of(x).data(), nullptr, N, C, OC);
  EXPECT_TRUE(close_scaled(got, want, mag, 1e-6, 1e-6, 4e-6));
}

INSTANTIATE_TEST_SUITE_P(, CudaMatmul,
                         ::testing::Values(MatmulShape{37, 48, 130, 48, 130},     // odd N and OC
                                           MatmulShape{37, 48, 130, 56, 133},     // strided, odd ld_out
                                           MatmulShape{1, 8, 1, 8, 1},            // degenerate
                                           MatmulShape{64, 256, 96, 768, 96},     // inp read out of a wider row
                                           MatmulShape{128, 512, 1024, 512, 3072},
                                           MatmulShape{1000, 64, 192, 64, 192},   // long k in backward_weight
                                           MatmulShape{17, 1000, 33, 1003, 40}));  // odd ld_in

// The same call twice gives the same bits (cuBLAS is reproducible for a fixed
// algorithm, workspace and stream; the reduction schemes allowed keep it so).
TEST(CudaMatmulDeterminism, SameBitsTwice) {
  KVS_REQUIRE_GPU();
  const int N = 512, C = 768, OC = 2304;
  const FVec inp = random_bf16_values(size_t(N) * C, 41), W = random_bf16_values(size_t(OC) * C, 42);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_W(to_bf16(W)), d_out(size_t(N) * OC);
  DeviceBuffer<float> d_dW(size_t(OC) * C);
  kc::Matmul mm;
  std::vector<uint16_t> first_out;
  FVec first_dW;
  for (int rep = 0; rep < 2; ++rep) {
    d_out.poison();
    d_dW.zero();
    mm.forward(d_out.get(), OC, d_inp.get(), C, d_W.get(), N, C, OC, nullptr);
    mm.backward_weight(d_dW.get(), d_out.get(), OC, d_inp.get(), C, N, C, OC, nullptr);
    std::vector<uint16_t> out_bits;
    for (bf16 x : d_out.download()) out_bits.push_back(bits(x));
    const FVec dW = d_dW.download();
    if (rep == 0) {
      first_out = out_bits;
      first_dW = dW;
    } else {
      EXPECT_TRUE(out_bits == first_out);
      EXPECT_EQ(std::memcmp(dW.data(), first_dW.data(), dW.size() * sizeof(float)), 0);
    }
  }
}

// Pointers that are only 2-byte aligned (a column offset of 1) get algorithms
// chosen for that alignment (cached apart from the 16-byte ones) and must
// still be right; the aligned call after them must not reuse their choice.
TEST(CudaMatmulAlignment, MisalignedPointers) {
  KVS_REQUIRE_GPU();
  const int N = 40, C = 64, OC = 72, ld_in = 80, ld_out = 90;
  const FVec inp = random_bf16_values(size_t(N) * ld_in + 1, 51), W = random_bf16_values(size_t(OC) * C, 52);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_W(to_bf16(W)), d_out(size_t(N) * ld_out + 1);
  DeviceBuffer<float> d_dW(size_t(OC) * C);
  d_dW.zero();
  kc::Matmul mm;
  mm.forward(d_out.get() + 1, ld_out, d_inp.get() + 1, ld_in, d_W.get(), N, C, OC, nullptr);
  // dW += out^T @ inp, with both operands at the odd offset.
  mm.backward_weight(d_dW.get(), d_out.get() + 1, ld_out, d_inp.get() + 1, ld_in, N, C, OC, nullptr);
  const std::vector<bf16> out = d_out.download();
  const FVec dW = d_dW.download();

  const FVec inp_shifted(inp.begin() + 1, inp.end());
  const DVec x = unpad(inp_shifted, N, C, ld_in), w(W.begin(), W.end());
  DVec want(size_t(N) * OC), mag(size_t(N) * OC);
  kvs::cpu::matmul_forward<double>(want.data(), x.data(), w.data(), N, C, OC);
  kvs::cpu::matmul_forward<double>(mag.data(), abs_of(x).data(), abs_of(w).data(), N, C, OC);
  FVec got(size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) got[size_t(n) * OC + o] = __bfloat162float(out[1 + size_t(n) * ld_out + o]);
  EXPECT_TRUE(close_scaled(got, want, mag, 1.0 / 256, 1e-6, 4e-6));

  // The weight gradient against the bf16 activations the GPU produced.
  const DVec y(got.begin(), got.end());
  DVec want_dW(size_t(OC) * C, 0.0), mag_dW(size_t(OC) * C, 0.0);
  kvs::cpu::matmul_backward<double>(nullptr, want_dW.data(), y.data(), x.data(), nullptr, N, C, OC);
  kvs::cpu::matmul_backward<double>(nullptr, mag_dW.data(), abs_of(y).data(), abs_of(x).data(), nullptr, N, C, OC);
  EXPECT_TRUE(close_scaled(dW, want_dW, mag_dW, 1e-6, 1e-6, 4e-6));

  // The same shape with aligned pointers (the misaligned choice is cached under
  // its own key) gives the same products.
  DeviceBuffer<bf16> d_inp_al(to_bf16(inp_shifted)), d_out_al(size_t(N) * ld_out);
  mm.forward(d_out_al.get(), ld_out, d_inp_al.get(), ld_in, d_W.get(), N, C, OC, nullptr);
  const std::vector<bf16> out_al = d_out_al.download();
  FVec got_al(size_t(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) got_al[size_t(n) * OC + o] = __bfloat162float(out_al[size_t(n) * ld_out + o]);
  EXPECT_TRUE(close_scaled(got_al, want, mag, 1.0 / 256, 1e-6, 4e-6));
}

// Empty reductions: C = 0 makes forward write zeros; N = 0 leaves dW as it was.
TEST(CudaMatmulEdge, EmptyReduction) {
  KVS_REQUIRE_GPU();
  const int N = 5, OC = 7, C = 3;
  DeviceBuffer<bf16> d_out(size_t(N) * OC), d_dummy(8);
  kc::Matmul mm;
  mm.forward(d_out.get(), OC, d_dummy.get(), 1, d_dummy.get(), N, 0, OC, nullptr);
  for (bf16 x : d_out.download()) EXPECT_EQ(__bfloat162float(x), 0.0f);
  const FVec dW0 = random_bf16_values(size_t(OC) * C, 61);
  DeviceBuffer<float> d_dW(dW0);
  mm.backward_weight(d_dW.get(), d_dummy.get(), OC, d_dummy.get(), C, 0, C, OC, nullptr);
  EXPECT_TRUE(d_dW.download() == dW0);
}

// ================================================================ cross-entropy

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

// ================================================================ reductions

class CudaReduce : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaReduce, SumAndSumSquaresMatchHostAndRepeatBitwise) {
  KVS_REQUIRE_GPU();
  const size_t n = GetParam();
  std::mt19937_64 g(91 + n);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  FVec x(n);
  for (auto& v : x) v = nd(g);
  double sum = 0, sum_abs = 0, sum_sq = 0;
  for (float v : x) {
    sum += v;
    sum_abs += std::fabs(double(v));
    sum_sq += double(v) * v;
  }

  DeviceBuffer<float> d_x(n);
  if (n) d_x.upload(x);
  DeviceBuffer<double> d_scratch(kc::sum_scratch_doubles(n)), d_out(2);
  double first[2] = {0, 0};
  for (int rep = 0; rep < 2; ++rep) {
    d_out.poison();
    d_scratch.poison();
    kc::sum_f32(d_out.get(), d_x.get(), n, d_scratch.get(), nullptr);
    kc::sum_squares_f32(d_out.get() + 1, d_x.get(), n, d_scratch.get(), nullptr);
    const std::vector<double> out = d_out.download();
    EXPECT_NEAR(out[0], sum, 1e-11 * sum_abs + 1e-300) << "n = " << n;
    EXPECT_NEAR(out[1], sum_sq, 1e-11 * sum_sq + 1e-300) << "n = " << n;
    if (rep == 0) {
      first[0] = out[0], first[1] = out[1];
    } else {  // the same bits
      EXPECT_EQ(std::memcmp(&first[0], &out[0], sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(&first[1], &out[1], sizeof(double)), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, CudaReduce,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{1000}, size_t{262144 * 4 + 5},
                                           size_t{(1u << 24) + 3}));

// ================================================================ AdamW

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
  ASSERT_EQ(chunks.size(), 6u);

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
