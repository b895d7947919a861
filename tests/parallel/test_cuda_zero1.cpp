// ZeRO-1 on the CUDA engine (device buffers), single process: the engine's
// shard hooks give exactly the unsharded CUDA AdamW step, an engine narrowed
// to one shard keeps only that shard's moments, Zero1 over the single-process
// communicator (the host-staged path) equals the plain step, and the overlap
// hook announces every gradient exactly once without changing a bit.
// Then `mpirun -np 2` with device cuda on one GPU (MPI backend, CUDA buffers
// staged through the host) follows the single-process CUDA loss curve.
// Skipped without a GPU; run on an H100 and an H200 (docs/CUDA.md), all
// but the two-GPU test.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "build_paths.h"
#include "cuda_test_util.h"
#include "dist/comm.h"
#include "dist_test_util.h"
#include "kernels/cuda/device.h"
#include "model/config.h"
#include "model/cuda_engine.h"
#include "model/params.h"
#include "parallel/zero1.h"
#include "train/trainer.h"

using namespace kvs::testing_util;

namespace {


std::vector<float> params_of(const kvs::Engine& e) {
  std::vector<float> p(e.layout().total);
  e.read_params(p.data());
  return p;
}
std::pair<std::vector<float>, std::vector<float>> moments_of(const kvs::Engine& e) {
  std::vector<float> m(e.layout().total), v(e.layout().total);
  e.read_optimizer_state(m.data(), v.data());
  return {m, v};
}

// Records the announced ranges and, once each range's event has completed, a
// copy of its gradients then (`grads`: the engine's flat device gradients):
// a range announced before its last gradient kernel ran differs from the
// backward's final gradients.
struct Recorder : kvs::Engine::GradReadyHook {
  std::vector<std::pair<size_t, size_t>> ranges;
  const float* grads = nullptr;
  std::vector<float> at_announce;
  void grads_ready(size_t b, size_t e, void* ev) override {
    EXPECT_NE(ev, nullptr);
    ranges.push_back({b, e});
    if (!grads || !ev) return;
    ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)), cudaSuccess);
    at_announce.resize(std::max(at_announce.size(), e));
    ASSERT_EQ(cudaMemcpy(at_announce.data() + b, grads + b, (e - b) * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
};

}  // namespace

// Shard by shard (boundaries cutting tensors, clamp01 shift tensors), the
// shard hooks equal the whole-model CUDA step bit for bit, and the shards'
// squared norms sum to the whole norm.
TEST(CudaZero1, ShardUpdateEqualsUnshardedCudaAdamW) {
  KVS_REQUIRE_GPU();
  nlohmann::json j = tiny_cuda_config(true, 1);
  j["model"]["kv_shift"]["parametrization"] = "clamp01";
  const kvs::Config c = validated(j, "cuda-zero1");
  kvs::CudaEngine whole(c.model, 2, 16), sharded(c.model, 2, 16);
  const auto& layout = whole.layout();
  std::vector<float> init(layout.total);
  kvs::init_params(layout, c.model, 7, init.data());
  whole.write_params(init.data());
  sharded.write_params(init.data());
  const TinyBatch d = tiny_batch(7);
  expect_shard_steps_equal_whole(whole, sharded, d.batch());
}

// keep_optimizer_range frees the other moments: zeros outside on read, the
// same shard update as the whole engine, and no step outside the shard.
TEST(CudaZero1, EngineKeepsOnlyItsShard) {
  KVS_REQUIRE_GPU();
  const kvs::Config c = validated(tiny_cuda_config(true, 1), "cuda-zero1");
  kvs::CudaEngine whole(c.model, 2, 16), part(c.model, 2, 16);
  const size_t n = whole.layout().total;
  std::vector<float> init(n);
  kvs::init_params(whole.layout(), c.model, 3, init.data());
  whole.write_params(init.data());
  part.write_params(init.data());
  const auto s = kvs::shard_range(n, 3, 1);
  part.keep_optimizer_range(s.begin, s.end);
  const TinyBatch d = tiny_batch(5);
  for (int step = 1; step <= 3; ++step) {
    for (auto* e : {&whole, &part}) {
      e->zero_grad();
      e->forward_backward(d.batch(), 1.0 / 32);
    }
    const kvs::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 1.0};
    whole.adamw_step(h);
    part.adamw_step_range(h, s.begin, s.end);
    std::vector<float> pa = params_of(whole), pb = params_of(part);
    for (size_t i = s.begin; i < s.end; ++i) ASSERT_EQ(pb[i], pa[i]) << "step " << step << " element " << i;
    part.write_params(pa.data());  // the all-gather's part
  }
  const auto [ma, va] = moments_of(whole);
  const auto [mb, vb] = moments_of(part);
  for (size_t i = 0; i < n; ++i) {
    const bool in_shard = i >= s.begin && i < s.end;
    ASSERT_EQ(mb[i], in_shard ? ma[i] : 0.0f) << i;
    ASSERT_EQ(vb[i], in_shard ? va[i] : 0.0f) << i;
  }
  EXPECT_KVS_ERROR(part.adamw_step_range({}, 0, n), "outside the optimizer moments held");
}

// Zero1 with the single-process communicator takes the host-staged path
// (device buffers -> pinned host -> collective -> device) and refreshes the
// bf16 copy: the same steps and losses as the plain CUDA engine, bit for bit.
// With the fp32 master sharded (train.shard_master; here one shard of all of
// it) the bf16 copy and the fp32 copies ride the collectives instead, and
// the steps are the same bits too.
TEST(CudaZero1, StagedZero1OverOneRankEqualsThePlainStep) {
  KVS_REQUIRE_GPU();
  for (const bool shard_master : {false, true}) {
    SCOPED_TRACE(shard_master ? "master sharded" : "master whole");
    const kvs::Config c = validated(tiny_cuda_config(true, 1), "cuda-zero1");
    kvs::CudaEngine plain(c.model, 2, 16), zeroed(c.model, 2, 16);
    std::vector<float> init(plain.layout().total);
    kvs::init_params(plain.layout(), c.model, 11, init.data());
    plain.write_params(init.data());
    zeroed.write_params(init.data());
    auto comm = kvs::dist::make_single_process();
    kvs::Zero1 z(zeroed, *comm, {}, {}, shard_master);
    EXPECT_EQ(z.master_sharded(), shard_master);
    const TinyBatch d = tiny_batch(3);
    for (int step = 1; step <= 3; ++step) {
      plain.zero_grad();
      zeroed.zero_grad();
      const double la = plain.forward_backward(d.batch(), 1.0 / 32);
      z.overlap_next_backward();  // a no-op on the staged path
      const double lb = zeroed.forward_backward(d.batch(), 1.0 / 32);
      EXPECT_EQ(la, lb) << "step " << step;
      EXPECT_EQ(z.reduce_gradients(), plain.grad_norm()) << "step " << step;
      const kvs::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.9};
      plain.adamw_step(h);
      z.step(h);
      ASSERT_EQ(params_of(plain), params_of(zeroed)) << "step " << step;
    }
    std::vector<float> m(plain.layout().total), v(m.size()), p(m.size());
    z.gather_optimizer_range(0, m.size(), m.data(), v.data());
    EXPECT_EQ(moments_of(plain), std::make_pair(m, v));
    z.gather_params_range(0, p.size(), p.data());
    EXPECT_EQ(params_of(plain), p);
    // A fourth forward reads what the last gather left: the bf16 copy and the fp32 copies.
    EXPECT_EQ(plain.forward(d.batch(), nullptr, nullptr, nullptr),
              zeroed.forward(d.batch(), nullptr, nullptr, nullptr));
  }
}

// train.shard_master on one engine: keep_master_range, before the weights
// are written or after, keeps the master of its shard and whole fp32 copies
// of exactly the norm gains and shift coefficients (packed in layout order);
// a read of anything else is an error, and so is an update outside the
// shard; the forward (bf16 copy, fp32 copies) gives the whole engine's loss;
// and the shard's update is the whole engine's, bit for bit, its fp32 copies
// refreshed.
TEST(CudaZero1, ShardedMasterKeepsItsShardAndWholeFp32Tensors) {
  KVS_REQUIRE_GPU();
  const kvs::Config c = validated(tiny_cuda_config(true, 1), "cuda-zero1");
  kvs::CudaEngine whole(c.model, 2, 16), before(c.model, 2, 16), after(c.model, 2, 16);
  const kvs::ParamLayout& layout = whole.layout();
  const size_t n = layout.total;
  std::vector<float> init(n);
  kvs::init_params(layout, c.model, 9, init.data());
  const auto s = kvs::shard_range(n, 3, 1);
  before.keep_master_range(s.begin, s.end);
  for (kvs::CudaEngine* e : {&whole, &before, &after}) e->write_params(init.data());
  after.keep_master_range(s.begin, s.end);
  std::vector<const kvs::ParamTensor*> fp32, outside;
  for (const kvs::ParamTensor& t : layout.tensors) {
    if (t.kind == kvs::ParamKind::Norm || t.kind == kvs::ParamKind::Shift) fp32.push_back(&t);
    else if (t.offset + t.numel <= s.begin || t.offset >= s.end) outside.push_back(&t);
  }
  ASSERT_GE(fp32.size(), 7u);  // 2 layers' norms and k/v shifts, the final norm
  ASSERT_FALSE(outside.empty());
  const TinyBatch d = tiny_batch(4);
  const double loss = whole.forward(d.batch(), nullptr, nullptr, nullptr);
  for (kvs::CudaEngine* e : {&before, &after}) {
    SCOPED_TRACE(e == &before ? "sharded before the writes" : "sharded after them");
    EXPECT_TRUE(e->master_sharded());
    const std::vector<kvs::Engine::Fp32Copy> copies = e->fp32_copies();
    ASSERT_EQ(copies.size(), fp32.size());
    for (size_t i = 0; i < copies.size(); ++i) {
      EXPECT_EQ(copies[i].offset, fp32[i]->offset);
      EXPECT_EQ(copies[i].n, fp32[i]->numel);
      if (i) {
        EXPECT_EQ(copies[i].data, copies[i - 1].data + copies[i - 1].n) << "not packed";
      }
      std::vector<float> got(copies[i].n);
      e->read_params_range(copies[i].offset, copies[i].n, got.data());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), init.begin() + copies[i].offset)) << copies[i].offset;
    }
    std::vector<float> shard(s.end - s.begin);
    e->read_params_range(s.begin, shard.size(), shard.data());
    EXPECT_TRUE(std::equal(shard.begin(), shard.end(), init.begin() + s.begin));
    std::vector<float> other(outside.front()->numel);
    EXPECT_KVS_ERROR(e->read_params_range(outside.front()->offset, other.size(), other.data()), "is not all held here");
    EXPECT_KVS_ERROR(e->adamw_step_range({}, 0, n), "outside the fp32 master held");
    EXPECT_EQ(e->forward(d.batch(), nullptr, nullptr, nullptr), loss);
  }
  // One step: the shard's update is the whole engine's; the fp32 copies in the shard follow it.
  for (kvs::CudaEngine* e : {&whole, &before}) {
    e->zero_grad();
    e->forward_backward(d.batch(), 1.0 / 32);
  }
  const kvs::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  whole.adamw_step(h);
  before.adamw_step_range(h, s.begin, s.end);
  const std::vector<float> want = params_of(whole);
  std::vector<float> shard(s.end - s.begin);
  before.read_params_range(s.begin, shard.size(), shard.data());
  EXPECT_TRUE(std::equal(shard.begin(), shard.end(), want.begin() + s.begin));
  size_t refreshed = 0;
  for (const kvs::Engine::Fp32Copy& t : before.fp32_copies()) {
    std::vector<float> got(t.n);
    ASSERT_EQ(cudaMemcpy(got.data(), t.data, t.n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < t.n; ++i) {
      const size_t at = t.offset + i;
      const bool held = at >= s.begin && at < s.end;
      ASSERT_EQ(got[i], held ? want[at] : init[at]) << "element " << at << (held ? " (in the shard)" : "");
      refreshed += held && want[at] != init[at];
    }
  }
  EXPECT_GT(refreshed, 0u) << "no fp32 copy in the shard changed: the test checks nothing";
}

// The overlap hook: ranges in backward order (tail, layers L-1..0,
// embedding) covering every parameter once, each range contiguous, each final
// when its event completes (what the NCCL reduction reads then is what the
// backward leaves), and the gradients are unchanged by announcing.
TEST(CudaZero1, BackwardAnnouncesEveryGradientOnce) {
  KVS_REQUIRE_GPU();
  for (bool tied : {false, true}) {
    nlohmann::json j = tiny_cuda_config(true, 1);
    j["model"]["tie_word_embeddings"] = tied;
    const kvs::Config c = validated(j, "cuda-zero1");
    kvs::CudaEngine a(c.model, 2, 16), b(c.model, 2, 16);
    const size_t n = a.layout().total;
    std::vector<float> init(n);
    kvs::init_params(a.layout(), c.model, 5, init.data());
    a.write_params(init.data());
    b.write_params(init.data());
    Recorder rec;
    rec.grads = b.flat_grads();
    b.set_grad_ready_hook(&rec);
    const TinyBatch d = tiny_batch(7);
    a.zero_grad();
    b.zero_grad();
    a.forward_backward(d.batch(), 1.0 / 32);
    b.forward_backward(d.batch(), 1.0 / 32);
    b.set_grad_ready_hook(nullptr);
    ASSERT_EQ(rec.ranges.size(), static_cast<size_t>(c.model.num_hidden_layers) + 2);
    EXPECT_EQ(rec.ranges.front().second, n);
    EXPECT_EQ(rec.ranges.back().first, 0u);
    for (size_t i = 1; i < rec.ranges.size(); ++i) EXPECT_EQ(rec.ranges[i].second, rec.ranges[i - 1].first);
    std::vector<float> ga(n), gb(n);
    a.read_grads(ga.data());
    b.read_grads(gb.data());
    EXPECT_EQ(ga, gb);
    EXPECT_EQ(rec.at_announce, gb) << "a range was announced before its gradients were final";
  }
}

// Two MPI ranks on one GPU, CUDA buffers staged through the host, follow the
// single-process CUDA curve (same global batch). Not bit-identical: each
// rank sums its own micro-batches' fp32 gradients before the ranks are
// summed, and a last-bit difference in a master weight can flip its bf16
// copy. 2e-3 relative over 20 steps (the CPU engine's dp runs agree within
// 4e-8); a wrong reduction or a stale bf16 copy moves the loss by more within
// a few steps: on the host build, dp = 2 agrees within 2.1e-4 and a
// planted missing gradient sum is 7e-3 off at step 2 (lr: tiny_cuda_config).
// The gradient norm drifts about ten times further than the loss once Adam
// has amplified the rounding: on an H200 (2026-11-29) the losses agreed
// within 3.1e-4 and the norms of steps 1-14 within 2e-3, those of steps
// 15-20 differed by up to 3.7e-3 (host build: losses 2.1e-4, norms 1.2e-3).
// After step 5 the norm is held to kLateNorm (a gradient summed where it is
// averaged is 100% off).
constexpr double kLateNorm = 1e-2;

TEST(CudaZero1, TwoMpiRanksOnOneGpuFollowTheSingleProcessCurve) {
  KVS_REQUIRE_GPU();
  for (bool shift : {true, false}) {
    TmpDir tmp;
    const std::string cfg = tmp / "c.json";
    spit(cfg, tiny_cuda_config(shift, 4).dump());
    train(0, cfg, tmp / "dp1");
    const Curve ref = read_metrics(tmp / "dp1");
    ASSERT_EQ(ref.train.size(), 20u);
    train(2, cfg, tmp / "dp2");
    expect_close(read_metrics(tmp / "dp2"), ref, 1, std::string(shift ? "shifted" : "vanilla") + " cuda dp=2 (mpi)",
                 2e-3, kLateNorm);
  }
}

// Two NCCL ranks, one GPU each, launched with torchrun's variables: ZeRO-1
// on the device buffers with each layer's reduction overlapped with the
// backward. Same tolerance and reasoning as above. Needs 2 GPUs.
TEST(CudaZero1, TwoNcclRanksOnTwoGpusFollowTheSingleProcessCurve) {
  KVS_REQUIRE_GPU();
  std::string why;
  if (kvs::cuda::device_count(&why) < 2) GTEST_SKIP() << "skipped: needs 2 GPUs";
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  train(0, cfg, tmp / "dp1");
  std::vector<FILE*> procs;
  for (int r = 0; r < 2; ++r) {
    const std::string cmd =
        "env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK KVS_BOOTSTRAP_TIMEOUT_S=60 "
        "RANK=" + std::to_string(r) + " WORLD_SIZE=2 LOCAL_RANK=" + std::to_string(r) +
        " LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29450 timeout 300 " + kvs::test::cli_binary() +
        " train --quiet --config " + cfg + " --run-dir " + (tmp / "dp2") + " 2>&1";
    procs.push_back(::popen(cmd.c_str(), "r"));
    ASSERT_NE(procs.back(), nullptr);
  }
  std::string out;
  for (FILE* p : procs) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int status = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  }
  EXPECT_NE(out.find("parallel layout: dp 2, tp 1, backend nccl, ZeRO-1"), std::string::npos) << out;
  expect_close(read_metrics(tmp / "dp2"), read_metrics(tmp / "dp1"), 1, "shifted cuda dp=2 (nccl, overlap)", 2e-3,
               kLateNorm);
}

// No GPU needed: the configurations above are valid, and dp > 1 on device
// cuda passes the layout check (tp > 1 on cuda: test_cuda_tp.cpp).
TEST(CudaZero1, TestConfigurationsAreValidAndDpIsAllowed) {
  for (bool shift : {true, false}) EXPECT_NO_THROW(validated(tiny_cuda_config(shift, 4), "cuda-zero1"));
  const kvs::Config c = validated(tiny_cuda_config(true, 4), "cuda-zero1");
  EXPECT_NO_THROW(kvs::check_parallel_layout(c, 2));
  EXPECT_NO_THROW(kvs::check_parallel_layout(c, 4));
}

#endif  // KVS_CUDA
