// Tensor parallelism (Megatron-style, docs/PARALLEL.md): the slicing of every
// tensor (no MPI needed), then mpirun runs at tp = 2 and dp = 2 x tp = 2 that
// follow the single-process loss curve with the same global batch, vanilla and
// shifted with GQA, resume across layouts, and fail cleanly on a bad layout.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "dist_test_util.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/tensor_parallel.h"
#include "train/model_io.h"

using namespace kvs::testing_util;

namespace {

kvs::Config tp_config(bool shift) {
  kvs::Config c = kvs::config_from_json(tiny_config(shift, 4), "tp");
  kvs::validate(c, "tp");
  return c;
}

// tp ranks in rank order, then the full buffer from them.
std::vector<float> round_trip(const kvs::ModelConfig& m, int tp, const std::vector<float>& full,
                              std::vector<std::vector<float>>* locals_out = nullptr) {
  const auto full_layout = kvs::ParamLayout::build(m);
  const auto local_layout = kvs::ParamLayout::build(m, 0, tp);
  std::vector<float> gathered(local_layout.total * tp, std::nanf(""));  // slice_to_local must write every element
  for (int r = 0; r < tp; ++r) {
    const auto lr = kvs::ParamLayout::build(m, r, tp);
    EXPECT_EQ(lr.total, local_layout.total) << "ranks must hold equal slices";
    kvs::slice_to_local(full_layout, lr, r, full.data(), gathered.data() + r * local_layout.total);
    if (locals_out)
      locals_out->emplace_back(gathered.begin() + r * local_layout.total,
                               gathered.begin() + (r + 1) * local_layout.total);
  }
  std::vector<float> back(full_layout.total, -1.0f);
  kvs::assemble_full(full_layout, local_layout, tp, gathered.data(), back.data());
  return back;
}

std::string curve_name(bool shift, int dp, int tp) {
  return std::string(shift ? "shifted" : "vanilla") + " dp=" + std::to_string(dp) + " tp=" + std::to_string(tp);
}

void tp_follows_single(bool shift) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(shift, 4).dump());
  train(0, cfg, tmp / "single");
  const Curve ref = read_metrics(tmp / "single");
  ASSERT_EQ(ref.train.size(), 20u);
  for (auto [np, tp] : {std::pair{2, 2}, std::pair{4, 2}}) {
    const std::string dir = tmp / ("np" + std::to_string(np));
    train(np, cfg, dir, "--set parallel.tp=" + std::to_string(tp));
    expect_close(read_metrics(dir), ref, 1, curve_name(shift, np / tp, tp));
  }
}

}  // namespace

// Which rows/columns each rank holds: q/k/v and the shifts by heads, o/down by
// columns, gate/up by rows, embedding/LM head by padded vocabulary rows.
TEST(TensorParallel, SliceShapesFollowMegatron) {
  kvs::Config c = tp_config(true);
  c.model.tie_word_embeddings = false;
  const auto L = kvs::ParamLayout::build(c.model, 1, 2);
  auto shape = [&](const std::string& n) { return L.find(n)->shape; };
  const int64_t D = c.model.head_dim();  // 4
  EXPECT_EQ(kvs::padded_vocab(c.model, 2), 512);  // 400 rounded up to 128 * 2
  EXPECT_EQ(shape("model.embed_tokens.weight"), (std::vector<int64_t>{256, 16}));
  EXPECT_EQ(shape("lm_head.weight"), (std::vector<int64_t>{256, 16}));
  EXPECT_EQ(shape("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{2 * D, 16}));
  EXPECT_EQ(shape("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{1 * D, 16}));
  EXPECT_EQ(shape("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{16, 2 * D}));
  EXPECT_EQ(shape("model.layers.0.self_attn.k_shift"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shape("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shape("model.layers.0.input_layernorm.weight"), (std::vector<int64_t>{16}));
  EXPECT_EQ(L.find("model.norm.weight")->split_dim, -1);
  // tp = 1 is the full layout, unpadded.
  const auto full = kvs::ParamLayout::build(c.model), one = kvs::ParamLayout::build(c.model, 0, 1);
  ASSERT_EQ(full.tensors.size(), one.tensors.size());
  for (size_t i = 0; i < full.tensors.size(); ++i) EXPECT_EQ(full.tensors[i].shape, one.tensors[i].shape);
}

// Slicing then assembling gives back every element; rank r holds exactly the
// rows/columns it should (checked on values that encode their position);
// vocabulary padding is zero.
TEST(TensorParallel, SliceAndAssembleRoundTrip) {
  for (bool tied : {true, false})
    for (int tp : {1, 2}) {
      SCOPED_TRACE(std::to_string(tp) + (tied ? " tied" : " untied"));
      kvs::Config c = tp_config(true);
      c.model.tie_word_embeddings = tied;
      c.model.kv_shift.shift_q = true;
      const auto full_layout = kvs::ParamLayout::build(c.model);
      std::vector<float> full(full_layout.total);
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i + 1);
      std::vector<std::vector<float>> locals;
      EXPECT_EQ(round_trip(c.model, tp, full, &locals), full);
      if (tp == 1) continue;
      const auto L1 = kvs::ParamLayout::build(c.model, 1, 2);
      const auto* q = full_layout.find("model.layers.1.self_attn.q_proj.weight");
      const auto* q1 = L1.find("model.layers.1.self_attn.q_proj.weight");
      // Rank 1's first q row is the full tensor's row Hq/2 * D (head 2).
      EXPECT_EQ(locals[1][q1->offset], full[q->offset + 2 * 4 * 16]);
      const auto* o = full_layout.find("model.layers.1.self_attn.o_proj.weight");
      const auto* o1 = L1.find("model.layers.1.self_attn.o_proj.weight");
      // Row 3 of rank 1's o_proj slice starts at full column 8.
      EXPECT_EQ(locals[1][o1->offset + 3 * 8], full[o->offset + 3 * 16 + 8]);
      // Rank 1's embedding rows are the vocabulary's 256..511: 256..399 real, the rest padding.
      const auto* e = full_layout.find("model.embed_tokens.weight");
      const auto* e1 = L1.find("model.embed_tokens.weight");
      const size_t H = 16, real_rows = 400 - 256;
      ASSERT_EQ(e1->numel, 256 * H);
      for (size_t i = 0; i < e1->numel; ++i)
        ASSERT_EQ(locals[1][e1->offset + i], i < real_rows * H ? full[e->offset + 256 * H + i] : 0.0f)
            << "element " << i;
    }
}

TEST(TensorParallel, VanillaFollowsSingleProcess) { tp_follows_single(false); }
TEST(TensorParallel, ShiftedGqaFollowsSingleProcess) { tp_follows_single(true); }

// The other shift variants through the sliced shift tensors: window 2, Q
// shifting and the sigmoid gate (tp = 2 against one process).
TEST(TensorParallel, ShiftVariantsFollowSingleProcess) {
  TmpDir tmp;
  auto j = tiny_config(true, 2);
  j["model"]["kv_shift"]["window"] = 2;
  j["model"]["kv_shift"]["shift_q"] = true;
  j["train"]["steps"] = 10;
  const std::string cfg = tmp / "c.json";
  spit(cfg, j.dump());
  train(0, cfg, tmp / "single");
  train(2, cfg, tmp / "tp2", "--set parallel.tp=2");
  expect_close(read_metrics(tmp / "tp2"), read_metrics(tmp / "single"), 1, "window 2 + q shift tp=2");
  j["model"]["kv_shift"] = {{"enabled", true}, {"parametrization", "sigmoid_gate"}};
  spit(cfg, j.dump());
  train(0, cfg, tmp / "single_gate");
  train(2, cfg, tmp / "tp2_gate", "--set parallel.tp=2");
  expect_close(read_metrics(tmp / "tp2_gate"), read_metrics(tmp / "single_gate"), 1, "sigmoid gate tp=2");
}

// A checkpoint is full tensors whatever the layout: saved at dp=2 x tp=2 and
// resumed in one process, and saved in one process and resumed at tp=2; the
// curves continue the uninterrupted single-process run, and the checkpoint
// written under tensor parallelism holds the same tensors as one process's.
TEST(TensorParallel, ResumeAcrossLayouts) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  train(0, cfg, tmp / "full");
  const Curve full = read_metrics(tmp / "full");
  struct Leg {
    int np, tp;
  };
  for (auto [first, second] : {std::pair{Leg{4, 2}, Leg{0, 1}}, std::pair{Leg{0, 1}, Leg{2, 2}}}) {
    const std::string dir = tmp / fmt::format("r{}_{}", first.np, second.np);
    train(first.np, cfg, dir, "--set train.steps=10 --set parallel.tp=" + std::to_string(first.tp));
    train(second.np, cfg, dir, "--resume --set parallel.tp=" + std::to_string(second.tp));
    expect_close(read_metrics(dir), full, 11,
                 "resume tp=" + std::to_string(first.tp) + " -> tp=" + std::to_string(second.tp));
  }
  // Same tensor names and shapes as the single-process checkpoint, values within float noise.
  const auto a = kvs::read_checkpoint(tmp / "r4_0/checkpoints/step_00000010");
  const auto b = kvs::read_checkpoint(tmp / "full/checkpoints/step_00000010");
  ASSERT_EQ(a.data.model.size(), b.data.model.size());
  for (size_t i = 0; i < a.data.model.size(); ++i) {
    ASSERT_EQ(a.data.model[i].name, b.data.model[i].name);
    ASSERT_EQ(a.data.model[i].shape, b.data.model[i].shape) << a.data.model[i].name;
    const auto x = kvs::tensor_to_f32(a.data.model[i]), y = kvs::tensor_to_f32(b.data.model[i]);
    for (size_t k = 0; k < x.size(); ++k) ASSERT_NEAR(x[k], y[k], 1e-5 + 1e-4 * std::abs(y[k])) << a.data.model[i].name;
  }
}

// A world size that is not a multiple of tp is a one-line error on every rank, not a hang.
TEST(TensorParallel, WorldNotAMultipleOfTpIsAClearError) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  const auto r = run_kvshift("train --quiet --config " + cfg + " --run-dir " + (tmp / "run") + " --set parallel.tp=2",
                             mpirun(3));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_NE(r.out.find("parallel.tp (2) must divide the number of processes (3)"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(tmp / "run/metrics.jsonl"));
}

// Replicated tensors (norm gains) must stay bit-identical across TP ranks;
// assembling a checkpoint from ranks that drifted apart is an error naming the tensor.
TEST(TensorParallel, DriftedReplicasAreAnError) {
  const kvs::Config c = tp_config(true);
  const auto full_layout = kvs::ParamLayout::build(c.model);
  const auto local_layout = kvs::ParamLayout::build(c.model, 0, 2);
  std::vector<float> full(full_layout.total, 0.5f), gathered(2 * local_layout.total);
  for (int r = 0; r < 2; ++r)
    kvs::slice_to_local(full_layout, kvs::ParamLayout::build(c.model, r, 2), r, full.data(),
                        gathered.data() + r * local_layout.total);
  gathered[local_layout.total + local_layout.find("model.norm.weight")->offset] += 1e-7f;
  try {
    kvs::assemble_full(full_layout, local_layout, 2, gathered.data(), full.data());
    ADD_FAILURE() << "no error";
  } catch (const kvs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("replicated tensor model.norm.weight"), std::string::npos) << e.what();
  }
}
