// CPU cross-entropy: the loss against log-softmax, the gradient against finite
// differences, masking, argmax ties, aliasing, float vs double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsCrossEntropy, LossMatchesLogSoftmaxAndGradientMatchesFiniteDifferences) {
  const int N = 6, V = 11;
  const double gs = 0.37;
  Vec logits = randn((size_t)N * V, 900, 2.0);
  logits[3 * V + 2] = logits[3 * V + 7] = 50.0;  // tie: argmax is the first one
  logits[4 * V + 1] = 1000.0;                    // needs the max subtraction
  std::vector<int32_t> tgt = {3, 0, 10, 7, 1, -1};
  std::vector<float> mask = {1, 0.5f, 0, 1, 1, 0};  // row 5 masked with an invalid target
  Vec losses(N, std::nan(""));
  Vec dl((size_t)N * V, std::nan(""));
  std::vector<int32_t> am(N, -5);
  cross_entropy_forward_backward(losses.data(), dl.data(), am.data(), logits.data(), tgt.data(), mask.data(), N, V, gs);
  for (int n = 0; n < N; ++n) {
    const double* x = &logits[(size_t)n * V];
    const double mx = *std::max_element(x, x + V);
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(x[v] - mx);
    const double logp_t = mask[n] ? x[tgt[n]] - mx - std::log(z) : 0.0;
    EXPECT_NEAR(losses[n], -mask[n] * logp_t, 1e-12) << "row " << n;
    EXPECT_EQ(am[n], (int)(std::max_element(x, x + V) - x));
  }
  EXPECT_EQ(am[3], 2);
  EXPECT_EQ(am[4], 1);
  EXPECT_NEAR(losses[4], 0.0, 1e-12);

  // d(sum of losses)/dlogits, scaled by grad_scale
  Vec tmp(N);
  auto f = [&] {
    cross_entropy_forward_backward(tmp.data(), (double*)nullptr, (int32_t*)nullptr, logits.data(), tgt.data(),
                                   mask.data(), N, V, gs);
    double s = 0;
    for (double l : tmp) s += l;
    return s;
  };
  Vec ng = numgrad(logits, f, 1e-5);
  for (double& x : ng) x *= gs;
  expect_grad_close(dl, ng, "dlogits");
  for (int v = 0; v < V; ++v) EXPECT_EQ(dl[(size_t)2 * V + v], 0.0) << "masked row";

  // dlogits may alias logits.
  Vec inplace = logits, l2(N);
  cross_entropy_forward_backward(l2.data(), inplace.data(), (int32_t*)nullptr, inplace.data(), tgt.data(), mask.data(),
                                 N, V, gs);
  EXPECT_EQ(l2, losses);
  EXPECT_EQ(inplace, dl);

  // float agrees with double (the extreme rows excluded from the relative norm
  // would dominate nothing: they are ordinary rows for this check).
  FVec lf = to_float(logits), lossf(N), dlf(dl.size());
  cross_entropy_forward_backward(lossf.data(), dlf.data(), (int32_t*)nullptr, lf.data(), tgt.data(), mask.data(), N, V,
                                 gs);
  EXPECT_LT(rel_err(to_double(lossf), losses), kFloatTol);
  EXPECT_LT(rel_err(to_double(dlf), dl), kFloatTol);
}

}  // namespace
