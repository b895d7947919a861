// ZeRO-1, its flat collectives and the gradient norm across ranks, each
// against one process: the world is the data-parallel (or tensor-parallel)
// group; every rank also runs the single-process reference on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu_engine.h"
#include "parallel/flat_sync.h"
#include "parallel/grad_norm.h"
#include "parallel/mpi_world.h"
#include "parallel/zero1.h"

namespace kvs {
namespace {

using testing_util::rel_err;
using testing_util::world;

ModelConfig tiny_model() {
  ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 32;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 4;  // divisible by a TP group of 4
  m.vocab_size = 400;  // padded to 128 x tp and split: real rows on every rank of tp 2 and tp 4
  m.max_position_embeddings = 8;
  return m;
}

// Sequence `i` of a deterministic toy batch (the same on every rank), its tokens spread over the
// whole vocabulary (every tensor-parallel rank's slice of it).
struct Toy {
  std::vector<int32_t> in, tg;
  Batch batch(int B, int T) const { return {B, T, in.data(), tg.data(), nullptr}; }
};
Toy toy(int i, int B, int T, int V) {
  Toy t;
  for (int j = 0; j < B * T; ++j) {
    t.in.push_back((151 * j + 13 * i + 1) % V);
    t.tg.push_back((89 * j + 3 * i + 2) % V);
  }
  return t;
}

std::vector<float> init(const ParamLayout& layout, const ModelConfig& m) {
  std::vector<float> p(layout.total);
  init_params(layout, m, 42, p.data());
  return p;
}

TEST(ShardRange, CoversTheBufferOnceInRankOrder) {
  for (int dp : {1, 2, 3, 4, 7})
    for (size_t total : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
      size_t next = 0;
      for (int r = 0; r < dp; ++r) {
        const ShardRange s = shard_range(total, dp, r);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.end - s.begin, s.padded_size);
        EXPECT_EQ(s.padded_size * dp >= total, true);
        next = s.end;
      }
      EXPECT_EQ(next, total);
    }
}

// The flat collectives: every rank's gradients summed into its shard, every
// shard of the parameters from its owner.
// Also in chunks of 7 floats (the last segment's last chunk partly beyond the buffer).
TEST(FlatSync, ReducesIntoTheShardAndGathersEveryShard) {
  for (const size_t max_count : {StagedFlatSync::kMaxCount, size_t{7}}) {
    SCOPED_TRACE(max_count);
    const int dp = world().size(), r = world().rank();
    const ModelConfig m = tiny_model();
    CpuEngine e(m, 1, 4);
    const size_t total = e.layout().total;
    const ShardRange shard = shard_range(total, dp, r);
    const StagedFlatSync::Copy copy = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
    auto staged = std::make_unique<StagedFlatSync>(e, world(), shard, copy, copy, max_count);
    // The host holds dp + 1 chunks, not a copy of the buffer.
    EXPECT_EQ(staged->chunk(), std::min(shard.padded_size, max_count));
    EXPECT_EQ(staged->host_floats(), (dp + 1) * staged->chunk());
    std::unique_ptr<FlatSync> sync = std::move(staged);
    float* g = e.host_grads();
    for (size_t i = 0; i < total; ++i) g[i] = static_cast<float>((r + 1) * (i % 97));
    sync->reduce_grads();
    const float ranks = dp * (dp + 1) / 2.0f;
    for (size_t i = shard.begin; i < shard.end; ++i) ASSERT_EQ(g[i], ranks * (i % 97)) << i;
    float* p = e.host_params();
    for (size_t i = 0; i < total; ++i) p[i] = i >= shard.begin && i < shard.end ? static_cast<float>(i) : -1.0f;
    sync->all_gather_params();
    for (size_t i = 0; i < total; ++i) ASSERT_EQ(p[i], static_cast<float>(i)) << i;
  }
}

// Two ZeRO-1 steps over dp ranks, each with its own micro-batch, against one
// process that accumulates every rank's micro-batch and runs plain AdamW.
TEST(Zero1, StepsMatchOneProcessAdamW) {
  const int dp = world().size(), r = world().rank();
  const ModelConfig m = tiny_model();
  const int B = 1, T = 4;
  CpuEngine ref(m, B, T), e(m, B, T);
  const std::vector<float> p0 = init(ref.layout(), m);
  ref.write_params(p0.data());
  e.write_params(p0.data());
  Zero1 zero1(e, world());
  AdamWHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  // Adam's first step moves each parameter by lr g / (|g| + eps): where the micro-batches' gradients
  // cancel to about eps, the summation order's 1e-11 moves it by 1e-3 lr. With eps 1e-8 one such
  // gate_proj weight of these tokens alone made the parameters differ by 1.02e-5 (its update by
  // 0.6%); with 1e-6 that weight differs by 5.7e-7.
  h.eps = 1e-6;
  for (int step = 1; step <= 2; ++step) {
    h.step = step;
    ref.zero_grad();
    for (int q = 0; q < dp; ++q) ref.forward_backward(toy(10 * step + q, B, T, m.vocab_size).batch(B, T), 0.5);
    const double ref_norm = ref.grad_norm();
    ref.adamw_step(h);

    e.zero_grad();
    e.forward_backward(toy(10 * step + r, B, T, m.vocab_size).batch(B, T), 0.5);
    const double norm = zero1.reduce_gradients();
    zero1.step(h);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "step " << step;
  }
  std::vector<float> want(ref.layout().total), got(e.layout().total);
  ref.read_params(want.data());
  e.read_params(got.data());
  EXPECT_LT(rel_err(got.data(), want.data(), want.size()), 1e-5);
  // The moments: each rank's shard, gathered, are the single process's. A
  // checkpoint gathers them tensor by tensor; here also the whole buffer, and
  // windows that cross the shards' edges.
  std::vector<float> m_ref(want.size()), v_ref(want.size()), m_all(want.size()), v_all(want.size());
  ref.read_optimizer_state(m_ref.data(), v_ref.data());
  zero1.gather_optimizer_range(0, want.size(), m_all.data(), v_all.data());
  EXPECT_LT(rel_err(m_all.data(), m_ref.data(), m_ref.size()), 1e-5);
  EXPECT_LT(rel_err(v_all.data(), v_ref.data(), v_ref.size()), 1e-5);
  std::vector<float> m_part(want.size(), -1.0f), v_part(want.size(), -1.0f);
  for (const ParamTensor& t : e.layout().tensors) {
    zero1.gather_optimizer_range(t.offset, t.numel, m_part.data() + t.offset, nullptr);
    zero1.gather_optimizer_range(t.offset, t.numel, nullptr, v_part.data() + t.offset);
  }
  for (const ParamTensor& t : e.layout().tensors)
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
      ASSERT_EQ(m_part[i], m_all[i]) << t.name << " element " << i - t.offset;
      ASSERT_EQ(v_part[i], v_all[i]) << t.name << " element " << i - t.offset;
    }
  const size_t S = zero1.shard().padded_size, width = S / 3 + 1;
  for (size_t at = 0; at < want.size(); at += width) {
    const size_t n = std::min(width, want.size() - at);
    std::vector<float> mw(n), vw(n);
    zero1.gather_optimizer_range(at, n, mw.data(), vw.data());
    ASSERT_EQ(std::memcmp(mw.data(), m_all.data() + at, n * sizeof(float)), 0) << "window " << at << "+" << n;
    ASSERT_EQ(std::memcmp(vw.data(), v_all.data() + at, n * sizeof(float)), 0) << "window " << at << "+" << n;
  }
}

// The gradient norm of a model split over a TP group of the world's size:
// the replicated norm gains counted once, the slices by every rank.
TEST(GradNorm, TensorParallelNormIsTheFullModels) {
  const int tp = world().size(), r = world().rank();
  const ModelConfig m = tiny_model();
  const int B = 2, T = 4;
  CpuEngine full(m, B, T), part(m, B, T, TensorParallel{r, tp, &world()});
  const std::vector<float> p0 = init(full.layout(), m);
  full.write_params(p0.data());
  std::vector<float> local(part.layout().total);
  slice_to_local(full.layout(), part.layout(), r, p0.data(), local.data());
  part.write_params(local.data());
  const Toy t = toy(3, B, T, m.vocab_size);
  full.zero_grad();
  part.zero_grad();
  const double loss_full = full.forward_backward(t.batch(B, T), 1.0);
  const double loss_part = part.forward_backward(t.batch(B, T), 1.0);
  EXPECT_NEAR(loss_part, loss_full, 1e-5 * std::abs(loss_full));
  const double want = full.grad_norm();
  EXPECT_NEAR(global_grad_norm(part, {r, tp, &world()}), want, 1e-5 * want);
}

}  // namespace
}  // namespace kvs
