// Data parallelism: the MPI runs (mpirun on the kvshift binary) follow the
// single-process loss curve with the same global batch, resume across
// layouts, and fail cleanly; the ZeRO-1 shard update equals the unsharded
// AdamW step (no MPI needed).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include "dist_test_util.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/flops.h"
#include "model/params.h"
#include "parallel/zero1.h"

using kvs::testing_util::run_kvshift;
using kvs::testing_util::TmpDir;

using namespace kvs::testing_util;

namespace {

void dp_follows_single(bool shift, const std::string& name) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  kvs::testing_util::spit(cfg, tiny_config(shift, 4).dump());
  train(0, cfg, tmp / "dp1");
  const Curve ref = read_metrics(tmp / "dp1");
  ASSERT_EQ(ref.train.size(), 20u);
  for (int np : {2, 4}) {
    const std::string dir = tmp / ("dp" + std::to_string(np));
    train(np, cfg, dir);
    expect_close(read_metrics(dir), ref, 1, name + " dp=" + std::to_string(np));
  }
}

}  // namespace

TEST(DistDp, VanillaFollowsSingleProcess) { dp_follows_single(false, "vanilla"); }
TEST(DistDp, ShiftedGqaFollowsSingleProcess) { dp_follows_single(true, "shifted"); }

TEST(DistDp, ResumeAcrossLayouts) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  kvs::testing_util::spit(cfg, tiny_config(true, 4).dump());
  train(0, cfg, tmp / "full");
  const Curve full = read_metrics(tmp / "full");
  // Saved at dp=2, resumed at dp=1; and saved at dp=1, resumed at dp=2.
  for (auto [first, second] : {std::pair{2, 0}, std::pair{0, 2}}) {
    const std::string dir = tmp / fmt::format("r{}_{}", first, second);
    train(first, cfg, dir, "--set train.steps=10");
    train(second, cfg, dir, "--resume");
    expect_close(read_metrics(dir), full, 11,
                 "resume dp=" + std::to_string(std::max(first, 1)) + " -> dp=" + std::to_string(std::max(second, 1)));
  }
}

TEST(DistDp, GradAccumNotDivisibleIsAOneLineError) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  kvs::testing_util::spit(cfg, tiny_config(false, 3).dump());
  const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + (tmp / "run"), mpirun(2));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("train.grad_accum_steps (3) must be a multiple of the data-parallel size (2 ranks)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("train.grad_accum_steps", r.out.find("train.grad_accum_steps") + 1), std::string::npos)
      << "reported more than once: " << r.out;
  EXPECT_FALSE(std::filesystem::exists(tmp / "run/metrics.jsonl"));
}

// A non-finite loss is an all-reduced value: every rank stops at the same
// step (no rank left waiting), and the last checkpoint stays intact.
TEST(DistDp, DivergenceStopsEveryRank) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", dir = tmp / "run";
  kvs::testing_util::spit(cfg, tiny_config(true, 4).dump());
  train(2, cfg, dir, "--set train.steps=3");
  const auto r = run_kvshift("train --quiet --resume --config " + cfg + " --run-dir " + dir +
                                 " --set train.lr=1e30 --set train.warmup_steps=0 --set train.grad_clip=0",
                             mpirun(2));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_NE(r.out.find("stopping; the last checkpoint"), std::string::npos) << r.out;
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/checkpoints/latest"), "step_00000003\n");
}

// Non-finite gradients on the second rank only (KVS_FAULT_INF_GRADIENT_STEP), the
// loss finite: both ranks stop on the gradient norm at that step.
TEST(DistDp, NonFiniteGradientOnOneRankStopsEveryRank) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", dir = tmp / "run";
  kvs::testing_util::spit(cfg, tiny_config(true, 4).dump());
  const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + dir +
                                 " --set train.steps=5 --set train.checkpoint_every=1",
                             "KVS_FAULT_INF_GRADIENT_STEP=3 " + mpirun(2));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("step 3: gradient norm is -?(nan|inf) — stopping; the last "
                                                  "checkpoint \\(" + dir + "/checkpoints/step_00000002\\) is intact")))
      << r.out;
  EXPECT_EQ(kvs::testing_util::slurp(dir + "/checkpoints/latest"), "step_00000002\n");
}

TEST(DistDp, CollectivesSelftest) {
  for (int np : {2, 3}) {
    const auto r = run_kvshift("dist-selftest", mpirun(np));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("dist-selftest: " + std::to_string(np) + " ranks, backend mpi: ok"), std::string::npos)
        << r.out;
  }
  const auto r = run_kvshift("dist-selftest");  // no mpirun: the single-process communicator
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 ranks, backend single: ok"), std::string::npos) << r.out;
}

TEST(DistDp, MismatchedSizesAreAClearErrorNotAHang) {
  const auto r = run_kvshift("dist-selftest --mismatch", mpirun(2));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_NE(r.out.find("all_reduce: ranks passed different sizes (min 3, max 4 elements"), std::string::npos) << r.out;
}

// ZeRO-1's shard update, shard by shard, gives exactly the unsharded AdamW
// step: shard boundaries cut tensors, and each element keeps its tensor's
// decay and clamp01 projection.
TEST(DistDp, Zero1ShardUpdateEqualsAdamW) {
  nlohmann::json j = tiny_config(true, 1);
  j["model"]["kv_shift"]["parametrization"] = "clamp01";
  kvs::Config c = kvs::config_from_json(j, "zero1");
  kvs::validate(c, "zero1");
  kvs::CpuEngine whole(c.model, 2, 16), sharded(c.model, 2, 16);
  const auto& layout = whole.layout();
  std::vector<float> init(layout.total);
  kvs::init_params(layout, c.model, 7, init.data());
  whole.write_params(init.data());
  sharded.write_params(init.data());
  std::vector<int32_t> in(32), tg(32);
  std::vector<float> mask(32, 1.0f);
  for (int i = 0; i < 32; ++i) in[i] = tg[(i + 31) % 32] = 2 + (i * 7) % 30;
  const kvs::Batch b{2, 16, in.data(), tg.data(), mask.data()};
  for (int dp : {3, 5}) {
    bool cut = false;
    for (int r = 0; r < dp; ++r) {
      const auto s = kvs::shard_range(layout.total, dp, r);
      for (const auto& t : layout.tensors) cut |= s.begin > t.offset && s.begin < t.offset + t.numel;
    }
    EXPECT_TRUE(cut) << "no shard boundary inside a tensor at dp=" << dp;
  }
  expect_shard_steps_equal_whole(whole, sharded, b);
  std::vector<float> p(layout.total);
  whole.read_params(p.data());
  int on_edge = 0;  // coefficients the projection moved onto 0 or 1
  for (const auto& t : layout.tensors)
    if (t.kind == kvs::ParamKind::Shift)
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
        ASSERT_TRUE(p[i] >= 0.0f && p[i] <= 1.0f) << t.name;
        on_edge += p[i] == 0.0f || p[i] == 1.0f;
      }
  EXPECT_GT(on_edge, 0) << "the clamp01 projection was never exercised";
}

// An engine narrowed to one shard keeps only that shard's moments (zeros
// outside on read), steps it exactly like the whole engine, and refuses to
// step outside it.
TEST(DistDp, Zero1EngineKeepsOnlyItsShard) {
  kvs::Config c = kvs::config_from_json(tiny_config(true, 1), "zero1");
  kvs::validate(c, "zero1");
  kvs::CpuEngine whole(c.model, 2, 16), part(c.model, 2, 16);
  const auto& layout = whole.layout();
  const size_t n = layout.total;
  std::vector<float> init(n);
  kvs::init_params(layout, c.model, 3, init.data());
  whole.write_params(init.data());
  part.write_params(init.data());
  const auto s = kvs::shard_range(n, 3, 1);
  part.keep_optimizer_range(s.begin, s.end);
  std::vector<int32_t> in(32), tg(32);
  std::vector<float> mask(32, 1.0f);
  for (int i = 0; i < 32; ++i) in[i] = tg[(i + 31) % 32] = 2 + (i * 5) % 30;
  const kvs::Batch b{2, 16, in.data(), tg.data(), mask.data()};
  for (int step = 1; step <= 3; ++step) {
    for (auto* e : {&whole, &part}) {
      e->zero_grad();
      e->forward_backward(b, 1.0 / 32);
    }
    const kvs::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 1.0};
    whole.adamw_step(h);
    part.adamw_step_range(h, s.begin, s.end);
    // The all-gather's part: the other shards' parameters come from their owners.
    std::vector<float> pa(n), pb(n);
    whole.read_params(pa.data());
    part.read_params(pb.data());
    for (size_t i = 0; i < n; ++i) {
      if (i >= s.begin && i < s.end) {
        ASSERT_EQ(pb[i], pa[i]) << "step " << step << " element " << i;
      }
      pb[i] = pa[i];
    }
    part.write_params(pb.data());
  }
  std::vector<float> ma(n), mb(n), va(n), vb(n);
  whole.read_optimizer_state(ma.data(), va.data());
  part.read_optimizer_state(mb.data(), vb.data());
  for (size_t i = 0; i < n; ++i) {
    const bool in_shard = i >= s.begin && i < s.end;
    ASSERT_EQ(mb[i], in_shard ? ma[i] : 0.0f) << i;
    ASSERT_EQ(vb[i], in_shard ? va[i] : 0.0f) << i;
  }
  EXPECT_KVS_ERROR(part.adamw_step_range({}, 0, n), "outside the optimizer moments held");
}

// Each train line of metrics.jsonl carries the model TFLOP/s per process
// (model/flops.h's FLOPs per token x the world's tokens/s / processes), as
// `bench` counts them; "mfu" only where a GPU's peak is known, so not on the CPU.
TEST(DistDp, MetricsCountModelFlopsPerProcess) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  kvs::testing_util::spit(cfg, tiny_config(true, 4).dump());
  const kvs::Config c = kvs::load_config(cfg);
  const double per_token = kvs::train_flops_per_token(c.model, c.train.seq_len);
  for (int np : {0, 2}) {
    const std::string dir = tmp / ("np" + std::to_string(np));
    train(np, cfg, dir, "--set train.steps=3 --set train.log_every=1");
    std::ifstream in(dir + "/metrics.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] != "train") continue;
      ++lines;
      const double want = per_token * j["tokens_per_s"].get<double>() / std::max(np, 1) / 1e12;
      EXPECT_NEAR(j["model_tflops_per_s"].get<double>(), want, 1e-12 + 1e-9 * want) << "np " << np << ": " << line;
      EXPECT_FALSE(j.contains("mfu")) << line;
    }
    EXPECT_EQ(lines, 3) << "np " << np;
  }
}
