// CUDA matmul (cuBLASLt, kernels/cuda/matmul.h) against kvs::cpu::matmul_*
// run in double on the same bf16-rounded inputs. Outputs start poisoned (NaN),
// so an element the GEMM forgets to write fails.
//
// Tolerances: bf16 activations within one bf16 ulp relative (2^-8, i.e.
// round-to-nearest's half ulp with room for fp32 differences before the
// rounding), plus a small absolute term for values that cancel; fp32 weight
// gradients (dW) accumulate in fp32 in a different order, so the error is
// bounded relative to mag = sum |a_i b_i| of the element's terms (4e-6 * mag,
// about 64 fp32 ulps of the largest partial sum).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/matmul.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;
using DVec = std::vector<double>;
using FVec = std::vector<float>;

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

// bench-gemm's Matmul::time_algorithms: the heuristic's algorithms in its
// order (rank 0 first, the one gemm() runs), each a median time; with rank 0
// last (max_algos 1) the product is gemm()'s bit for bit. An accumulating D
// (beta 1) grows by 1 + reps products per algorithm, as the contract says.
TEST(CudaMatmulAlgorithms, TimedAlgorithmsRunTheSameProduct) {
  KVS_REQUIRE_GPU();
  const int N = 96, C = 128, OC = 160;
  const FVec inp = random_bf16_values(size_t(N) * C, 43), W = random_bf16_values(size_t(OC) * C, 44);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_W(to_bf16(W)), d_out(size_t(N) * OC), d_ref(size_t(N) * OC);
  kc::Matmul mm;
  mm.forward(d_ref.get(), OC, d_inp.get(), C, d_W.get(), N, C, OC, nullptr);
  const auto many = mm.time_algorithms(true, false, OC, N, C, d_W.get(), C, d_inp.get(), C, 0.0f, d_out.get(), OC,
                                       false, 4, 3, nullptr);
  ASSERT_GE(many.size(), 1u);
  ASSERT_LE(many.size(), 4u);
  for (size_t i = 0; i < many.size(); ++i) {
    EXPECT_EQ(many[i].rank, static_cast<int>(i)) << "the heuristic's order";
    EXPECT_GE(many[i].ms, 0.0);
  }
  d_out.poison();
  const auto one = mm.time_algorithms(true, false, OC, N, C, d_W.get(), C, d_inp.get(), C, 0.0f, d_out.get(), OC,
                                      false, 1, 2, nullptr);
  ASSERT_EQ(one.size(), 1u);
  std::vector<uint16_t> out_bits, ref_bits;
  for (bf16 x : d_out.download()) out_bits.push_back(bits(x));
  for (bf16 x : d_ref.download()) ref_bits.push_back(bits(x));
  EXPECT_TRUE(out_bits == ref_bits) << "rank 0 is the algorithm gemm() runs";
  // dW += dout^T inp with beta 1: 1 untimed + 2 timed runs from zero give 3 x one product.
  DeviceBuffer<float> d_dW(size_t(OC) * C), d_dW1(size_t(OC) * C);
  d_dW.zero();
  d_dW1.zero();
  mm.backward_weight(d_dW1.get(), d_ref.get(), OC, d_inp.get(), C, N, C, OC, nullptr);
  mm.time_algorithms(false, true, C, OC, N, d_inp.get(), C, d_ref.get(), OC, 1.0f, d_dW.get(), C, true, 1, 2, nullptr);
  const FVec dW = d_dW.download(), dW1 = d_dW1.download();
  double err = 0, mag = 0;
  for (size_t i = 0; i < dW.size(); ++i) {
    err = std::max(err, std::fabs(dW[i] - 3.0 * dW1[i]));
    mag = std::max(mag, std::fabs(3.0 * dW1[i]));
  }
  EXPECT_LE(err, 1e-5 * mag);
  EXPECT_GT(mag, 0.0);
}

// train.time_gemm_algorithms: a timed Matmul runs the heuristic's first
// algorithm on a shape's first calls and remembers the shape; time_new_shapes
// then times each remembered shape's candidates on scratch operands of its own
// and keeps the fastest. The callers' buffers are untouched by the timing (an
// accumulating dW is not added to again), every shape is timed once, and the
// calls after it still compute the products (the same bits where the
// algorithms agree, as on the host build; within the tests' bounds on a GPU).
TEST(CudaMatmulAlgorithms, TimedShapesKeepTheCallersBuffersAndTheirProducts) {
  KVS_REQUIRE_GPU();
  const int N = 96, C = 128, OC = 160;
  const FVec inp = random_bf16_values(size_t(N) * C, 45), W = random_bf16_values(size_t(OC) * C, 46),
             dout = random_bf16_values(size_t(N) * OC, 47);
  DeviceBuffer<bf16> d_inp(to_bf16(inp)), d_W(to_bf16(W)), d_dout(to_bf16(dout)), out_t(size_t(N) * OC),
      out_p(size_t(N) * OC);
  DeviceBuffer<float> dW_t(size_t(OC) * C), dW_p(size_t(OC) * C);
  dW_t.zero();
  dW_p.zero();
  kc::Matmul timed, plain;
  timed.set_timed_algorithms(true);
  auto run = [&](kc::Matmul& mm, DeviceBuffer<bf16>& out, DeviceBuffer<float>& dW) {
    mm.forward(out.get(), OC, d_inp.get(), C, d_W.get(), N, C, OC, nullptr);
    mm.backward_weight(dW.get(), d_dout.get(), OC, d_inp.get(), C, N, C, OC, nullptr);  // dW += dout^T inp
  };
  run(timed, out_t, dW_t);
  run(plain, out_p, dW_p);
  EXPECT_FALSE(plain.has_new_shapes());
  ASSERT_TRUE(timed.has_new_shapes());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> out_before = out_t.download();
  const FVec dW_before = dW_t.download();
  const kc::Matmul::TimingReport report = timed.time_new_shapes(4, 2);
  EXPECT_EQ(report.skipped, "");
  ASSERT_EQ(report.chosen.size(), 2u) << "the forward's shape and the weight gradient's";
  for (const kc::Matmul::TimedChoice& c : report.chosen) {
    EXPECT_GE(c.candidates, 1);
    EXPECT_LE(c.candidates, 4);
    EXPECT_GE(c.rank, 0);
    EXPECT_LT(c.rank, c.candidates);
    EXPECT_LE(c.best_ms, c.first_ms) << c.shape;
  }
  EXPECT_FALSE(timed.has_new_shapes());
  EXPECT_EQ(timed.time_new_shapes(4, 2).chosen.size(), 0u) << "a shape is timed once";
  std::vector<uint16_t> a, b;
  for (bf16 x : out_t.download()) a.push_back(bits(x));
  for (bf16 x : out_before) b.push_back(bits(x));
  EXPECT_TRUE(a == b) << "the timing wrote the caller's output";
  EXPECT_TRUE(dW_t.download() == dW_before) << "the timing added to the caller's weight gradient";
  // Again with the chosen algorithms: dW now holds two products.
  run(timed, out_t, dW_t);
  run(plain, out_p, dW_p);
  const FVec ot = to_f32(out_t.download()), op = to_f32(out_p.download());
  const FVec gt = dW_t.download(), gp = dW_p.download();
  double err = 0, mag = 0;
  for (size_t i = 0; i < ot.size(); ++i) {
    err = std::max(err, std::fabs(double(ot[i]) - op[i]));
    mag = std::max(mag, std::fabs(double(op[i])));
  }
  EXPECT_LE(err, 1.0 / 128 * mag) << "forward: one bf16 rounding apart at most";
  err = mag = 0;
  for (size_t i = 0; i < gt.size(); ++i) {
    err = std::max(err, std::fabs(double(gt[i]) - gp[i]));
    mag = std::max(mag, std::fabs(double(gp[i])));
  }
  EXPECT_LE(err, 1e-5 * mag) << "weight gradient";
  EXPECT_GT(mag, 0.0);
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

}  // namespace
#endif  // KVS_CUDA
