// The CUDA engine's per-kernel profile (kernels/cuda/kernel_profile.h, `kvshift
// bench --profile` on CUDA): the arithmetic that turns event marks into per-op
// GPU times (no GPU needed), and that one training step marks every kernel
// and GEMM it runs, under its name and the projection's label, the number of
// times the model's structure says, across take() and restart() (on a GPU,
// and on the host build in CI).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/kernel_profile.h"
#include "model/cuda_engine.h"
#include "model/engine_variants.h"

namespace {

namespace kp = kvs::cuda::profile;

std::map<std::string, kp::OpStat> by_name(const std::vector<kp::OpStat>& rows) {
  std::map<std::string, kp::OpStat> m;
  for (const auto& r : rows) m[r.name] = r;
  return m;
}

// Two streams interleaved; each mark's event happened at at_ms[id].
TEST(CudaKernelProfile, EachStreamsOpsAreTimedFromItsPreviousMark) {
  int a = 0, b = 0;  // stand-ins for two streams
  const std::vector<double> at_ms = {1.0, 2.0, 4.0, 7.0, 11.0, 16.0, 22.0};
  const std::vector<kp::Mark> marks = {
      {"start a", &a, 0, 0},   // a's first mark: starts its clock only
      {"k1", &a, 10, 1},       // 1 ms after id 0
      {"start b", &b, 0, 2},   // b's first mark
      {"k1", &b, 20, 3},       // 3 ms after id 2 (b's clock, not a's)
      {"gemm x", &a, 100, 4},  // 9 ms after id 1
  };
  std::vector<std::pair<const void*, int>> start;
  auto elapsed = [&](int from, int to) { return at_ms[to] - at_ms[from]; };
  auto rows = kp::sum_marks(marks, start, elapsed);
  auto m = by_name(rows);
  ASSERT_EQ(rows.size(), 2u) << "the two first marks are not ops";
  EXPECT_EQ(rows[0].name, "k1") << "first-call order";
  EXPECT_EQ(m["k1"].calls, 2);
  EXPECT_DOUBLE_EQ(m["k1"].seconds, (1.0 + 3.0) / 1000);
  EXPECT_DOUBLE_EQ(m["k1"].flops, 30);
  EXPECT_DOUBLE_EQ(m["gemm x"].seconds, 9.0 / 1000);
  // Each stream's last mark carries over as its next op's start.
  ASSERT_EQ(start.size(), 2u);
  EXPECT_EQ(start[0].first, &a);
  EXPECT_EQ(start[0].second, 4);
  EXPECT_EQ(start[1].second, 3);
  const std::vector<kp::Mark> next = {{"k2", &b, 0, 5}, {"k2", &a, 0, 6}};
  auto m2 = by_name(kp::sum_marks(next, start, elapsed));
  EXPECT_EQ(m2["k2"].calls, 2) << "no first-mark loss after the first round";
  EXPECT_DOUBLE_EQ(m2["k2"].seconds, ((16.0 - 7.0) + (22.0 - 11.0)) / 1000);
}

// start() (an empty name) restarts a stream's clock without timing
// anything: the overlapped AdamW's stream waits a whole forward and backward
// for the gradients, and that wait is no op's time.
TEST(CudaKernelProfile, AStartMarkRestartsItsStreamsClockOnly) {
  int a = 0, b = 0;
  const std::vector<double> at_ms = {0.0, 1.0, 3.0, 40.0, 42.0, 45.0, 50.0};
  const std::vector<kp::Mark> marks = {
      {"fwd", &a, 0, 0},   // starts a's clock
      {"adamw", &b, 0, 1},  // starts b's clock
      {"bwd", &a, 0, 2},   // 3 ms
      {"", &b, 0, 3},      // b waited for the backward: restart at 40
      {"adamw", &b, 0, 4},  // 2 ms, not 41
      {"", &b, 0, 5},      // two starts in a row: the later one counts
      {"adamw", &b, 0, 6},  // 5 ms
  };
  std::vector<std::pair<const void*, int>> start;
  auto m = by_name(kp::sum_marks(marks, start, [&](int from, int to) { return at_ms[to] - at_ms[from]; }));
  ASSERT_EQ(m.size(), 2u) << "a start mark is no op";
  EXPECT_DOUBLE_EQ(m["adamw"].seconds, (2.0 + 5.0) / 1000);
  EXPECT_EQ(m["adamw"].calls, 2);
  EXPECT_DOUBLE_EQ(m["bwd"].seconds, 3.0 / 1000);
}

size_t count_prefix(const std::map<std::string, kp::OpStat>& m, const std::string& prefix, long* calls) {
  size_t names = 0;
  *calls = 0;
  for (const auto& [name, s] : m)
    if (name.rfind(prefix, 0) == 0) {
      ++names;
      *calls += s.calls;
    }
  return names;
}

// One step of a 2-layer model: every projection's three GEMMs under its label
// and shape, the attention kernels once per layer, the batch copy once. The
// first step's very first op only starts the stream's clock; the second step,
// after take(), times every op including that one.
TEST(CudaKernelProfile, EveryKernelAndGemmOfAStepIsMarked) {
  KVS_REQUIRE_GPU();
  const auto& v = kvs::testing_util::kEngineVariants[1];  // shift_gqa, 2 layers
  const kvs::ModelConfig m = kvs::testing_util::model_of(v);
  const int B = 2, T = 16, L = m.num_hidden_layers, N = B * T;
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 3);
  const kvs::cuda_test::RandomBatch data(m, B, T, 5);
  kvs::CudaEngine gpu(m, B, T);
  gpu.write_params(params.data());
  auto step = [&] {
    gpu.zero_grad();
    gpu.forward_backward(data.batch(), 1.0 / N);
    const double gn = gpu.grad_norm();
    gpu.adamw_step({1e-4, 0.9, 0.95, 1e-8, 0.1, 1, gn > 1.0 ? 1.0 / gn : 1.0});
  };
  kp::take();
  kp::set_enabled(true);
  step();
  const auto first = kp::take();
  step();
  const auto rows = kp::take();
  // restart() drops what was timed but keeps each stream's clock: the step after it counts as one taken.
  step();
  kp::restart();
  step();
  const auto after_restart = kp::take();
  kp::set_enabled(false);
  ASSERT_FALSE(rows.empty());
  const auto s = by_name(rows), s1 = by_name(first);

  const int C = m.hidden_size, F = m.intermediate_size, D = C / m.num_attention_heads;
  const int QKV = (m.num_attention_heads + 2 * m.num_key_value_heads) * D;
  auto calls = [&](const std::string& name) {
    auto it = s.find(name);
    return it == s.end() ? 0L : it->second.calls;
  };
  const std::string shape = std::to_string(N) + "x";
  EXPECT_EQ(calls("qkv proj fwd " + shape + std::to_string(QKV) + "x" + std::to_string(C)), L);
  EXPECT_EQ(calls("qkv proj bwd dW " + std::to_string(QKV) + "x" + std::to_string(C) + "x" + std::to_string(N)), L);
  EXPECT_EQ(calls("gate,up proj fwd " + shape + std::to_string(2 * F) + "x" + std::to_string(C)), L);
  EXPECT_EQ(calls("down proj bwd dinp " + shape + std::to_string(F) + "x" + std::to_string(C)), L);
  EXPECT_EQ(calls("o proj fwd " + shape + std::to_string(C) + "x" + std::to_string(C)), L);
  EXPECT_EQ(calls("lm head fwd " + shape + std::to_string(m.vocab_size) + "x" + std::to_string(C)), 1);
  long gemm_calls = 0;
  EXPECT_EQ(count_prefix(s, "gemm ", &gemm_calls), 0u) << "a GEMM without its projection's label";
  EXPECT_EQ(calls("flash_attention_forward"), L);
  EXPECT_EQ(calls("flash_attention_backward (dK, dV)"), L);
  EXPECT_EQ(calls("flash_attention_backward (dQ)"), L);
  EXPECT_EQ(calls("copy: batch to the GPU"), 1);
  EXPECT_GE(calls("adamw_kernel"), 1);
  for (const auto& r : rows) {
    EXPECT_GE(r.seconds, 0.0) << r.name;
    if (r.name.find(" fwd ") != std::string::npos) {
      EXPECT_GT(r.flops, 0.0) << r.name;
    }
  }
  // The first step lost exactly one op, its first one, to starting the clock.
  long lost = 0;
  for (const auto& [name, st] : s) {
    auto it = s1.find(name);
    const long before = it == s1.end() ? 0 : it->second.calls;
    EXPECT_LE(st.calls - before, 1) << name;
    lost += st.calls - before;
  }
  EXPECT_EQ(lost, 1);
  const auto s3 = by_name(after_restart);
  ASSERT_EQ(s3.size(), s.size());
  for (const auto& [name, st] : s) EXPECT_EQ(s3.at(name).calls, st.calls) << name;
}

}  // namespace
#endif  // KVS_CUDA
