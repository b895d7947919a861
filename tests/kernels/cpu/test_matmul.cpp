// CPU matmul: the forward against a naive loop, the backward against finite
// differences, float (sgemm) vs double (dgemm); float on both GEMM libraries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsMatmul, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 7, OC = 6;
  Vec x = randn((size_t)N * C, 40), W = randn((size_t)OC * C, 41), R = randn((size_t)N * OC, 42);
  Vec out((size_t)N * OC, std::nan(""));  // forward overwrites (beta = 0)
  matmul_forward(out.data(), x.data(), W.data(), N, C, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += x[n * C + c] * W[o * C + c];
      EXPECT_NEAR(out[n * OC + o], s, 1e-12);
    }
  auto f = [&] {
    matmul_forward(out.data(), x.data(), W.data(), N, C, OC);
    return dot(out, R);
  };
  Vec dx0 = randn(x.size(), 43), dW0 = randn(W.size(), 44), dx = dx0, dW = dW0;
  Vec dxf(x.size(), 0.0), dWf(W.size(), 0.0);
  matmul_backward(dxf.data(), dWf.data(), R.data(), x.data(), W.data(), N, C, OC);
  matmul_backward(dx.data(), dW.data(), R.data(), x.data(), W.data(), N, C, OC);
  expect_grad_close(dxf, numgrad(x, f), "dinp");
  expect_grad_close(dWf, numgrad(W, f), "dW");
  EXPECT_LT(rel_err(dx, add(dx0, dxf)), 1e-14);
  EXPECT_LT(rel_err(dW, add(dW0, dWf)), 1e-14);

  // float (sgemm) vs double (dgemm), on a size where sgemm uses its blocked kernels
  const int N2 = 64, C2 = 96, OC2 = 80;
  Vec x2 = randn((size_t)N2 * C2, 45), W2 = randn((size_t)OC2 * C2, 46), g2 = randn((size_t)N2 * OC2, 47);
  Vec o2((size_t)N2 * OC2), dx2(x2.size(), 0.0), dW2(W2.size(), 0.0);
  matmul_forward(o2.data(), x2.data(), W2.data(), N2, C2, OC2);
  matmul_backward(dx2.data(), dW2.data(), g2.data(), x2.data(), W2.data(), N2, C2, OC2);
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN}) {
    SCOPED_TRACE(gemm_library_name(lib));
    const GemmLibraryScope on(lib);
    FVec x2f = to_float(x2), W2f = to_float(W2), g2f = to_float(g2), o2f(o2.size(), std::nanf("")),
         dx2f(x2.size(), 0.f), dW2f(W2.size(), 0.f);
    matmul_forward(o2f.data(), x2f.data(), W2f.data(), N2, C2, OC2);
    matmul_backward(dx2f.data(), dW2f.data(), g2f.data(), x2f.data(), W2f.data(), N2, C2, OC2);
    EXPECT_LT(rel_err(to_double(o2f), o2), kFloatTol);
    EXPECT_LT(rel_err(to_double(dx2f), dx2), kFloatTol);
    EXPECT_LT(rel_err(to_double(dW2f), dW2), kFloatTol);
  }
}

// overwrite_dinp: dinp = dout W whatever it held (NaN here), the same values
// as adding into zeros; dW still accumulates. OC = 0 writes zeros.
TEST(OpsMatmul, OverwritingTheInputGradientEqualsAddingIntoZeros) {
  for (GemmLibrary lib : {GemmLibrary::OpenBLAS, GemmLibrary::OneDNN}) {
    SCOPED_TRACE(gemm_library_name(lib));
    const GemmLibraryScope on(lib);
    const int N = 64, C = 96, OC = 80;
    FVec x = to_float(randn((size_t)N * C, 50)), W = to_float(randn((size_t)OC * C, 51)),
         g = to_float(randn((size_t)N * OC, 52)), dW0 = to_float(randn(W.size(), 53));
    FVec dx_add(x.size(), 0.f), dx_over(x.size(), std::nanf("")), dW_add = dW0, dW_over = dW0;
    matmul_backward(dx_add.data(), dW_add.data(), g.data(), x.data(), W.data(), N, C, OC);
    matmul_backward(dx_over.data(), dW_over.data(), g.data(), x.data(), W.data(), N, C, OC, /*overwrite_dinp=*/true);
    EXPECT_EQ(dx_over, dx_add);
    EXPECT_EQ(dW_over, dW_add);
    FVec dx_empty(x.size(), std::nanf(""));
    matmul_backward(dx_empty.data(), (float*)nullptr, g.data(), x.data(), W.data(), N, C, 0, true);
    EXPECT_EQ(dx_empty, FVec(x.size(), 0.f));
  }
}

}  // namespace
