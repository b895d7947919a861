// The embedding kernels (kernels/cuda/embedding.cu): the forward gather is an
// exact copy; the backward plan (a host function) groups positions by token;
// the deterministic backward adds into dwte (fp32 sums, 1e-5), leaves absent
// tokens' rows bit-identical and repeats bit for bit. Against the CPU ops in
// double; outputs start poisoned (NaN).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
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

std::vector<int32_t> random_tokens(int N, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> t(N);
  for (auto& x : t) x = d(g);
  return t;
}
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

}  // namespace
#endif  // KVS_CUDA
