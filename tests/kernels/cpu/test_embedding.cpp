// CPU embedding: the gather and its backward against finite differences, float vs double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/embedding.h"
#include "kernels/cpu/ops_test_util.h"

namespace {

using namespace kvs::cpu;
using namespace kvs::ops_test;

TEST(OpsEmbedding, ForwardGathersRowsAndBackwardMatchesFiniteDifferences) {
  const int N = 9, C = 5, Vocab = 4;
  std::vector<int32_t> tok(N);
  for (int n = 0; n < N; ++n) tok[n] = (n * 7 + 1) % Vocab;  // repeats
  Vec wte = randn((size_t)Vocab * C, 1), R = randn((size_t)N * C, 2), out((size_t)N * C);
  embedding_forward(out.data(), tok.data(), wte.data(), N, C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[(size_t)n * C + c], wte[(size_t)tok[n] * C + c]);

  auto f = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), N, C);
    return dot(out, R);
  };
  Vec g0 = randn(wte.size(), 3), g = g0, fresh(wte.size(), 0.0);
  embedding_backward(fresh.data(), R.data(), tok.data(), N, C);
  embedding_backward(g.data(), R.data(), tok.data(), N, C);
  expect_grad_close(fresh, numgrad(wte, f), "dwte");
  EXPECT_LT(rel_err(g, add(g0, fresh)), 1e-14) << "backward must accumulate";

  FVec gf(wte.size(), 0.f);
  embedding_backward(gf.data(), to_float(R).data(), tok.data(), N, C);
  EXPECT_LT(rel_err(to_double(gf), fresh), kFloatTol);
}

}  // namespace
