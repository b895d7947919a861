// `kvshift inspect` as a user runs it: a checkpoint with known shift
// coefficients gives exactly those numbers and the paper's Table 4 counts; a
// vanilla checkpoint says the shift is disabled; a missing one is a one-line error.
#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kvs::testing_util::TmpDir;

namespace {

using Result = kvs::testing_util::CommandResult;
using kvs::testing_util::run_kvshift;

// Trains one step of a 2-layer, 2-KV-head model and returns the run dir.
std::string train_tiny(const std::string& run_dir, bool shift, const char* parametrization = "free",
                       bool shift_q = false) {
  nlohmann::json j = {
      {"name", "inspect"},
      {"model",
       {{"hidden_size", 16},
        {"intermediate_size", 32},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 2},
        {"num_key_value_heads", 2},
        {"vocab_size", 32},
        {"max_position_embeddings", 16},
        {"kv_shift", {{"enabled", shift}, {"parametrization", parametrization}, {"shift_q", shift_q}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 32}, {"pool_size", 8}}}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 2},
        {"steps", 1},
        {"warmup_steps", 0},
        {"eval_every", 0},
        {"eval_sequences", 2},
        {"threads", 1}}}};
  kvs::Config c = kvs::config_from_json(j, "inspect");
  kvs::validate(c, "inspect");
  kvs::train(c, {run_dir, false, true});
  return run_dir;
}

}  // namespace

TEST(Inspect, ReportsKnownShiftCoefficientsAndTable4) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp / "run", true);
  const std::string step = kvs::latest_checkpoint(run + "/checkpoints");
  ASSERT_FALSE(step.empty());
  // Known values, [layer][head] = {prev, cur}:
  //   a (k_shift): L0H0 cur>prev, L0H1 cur<=prev (equal), L1H0 cur>prev, L1H1 cur<prev
  //   b (v_shift): L0H0 cur>prev, L0H1 cur<prev,          L1H0 cur<prev, L1H1 cur>prev
  // => (a>,b>)=1 (L0H0), (a>,b<=)=1 (L1H0), (a<=,b>)=1 (L1H1), (a<=,b<=)=1 (L0H1).
  const float a[2][2][2] = {{{0.25f, 0.75f}, {0.5f, 0.5f}}, {{-0.125f, 1.5f}, {0.875f, 0.0625f}}};
  const float b[2][2][2] = {{{0.0f, 1.0f}, {0.625f, 0.25f}}, {{1.25f, 0.5f}, {0.375f, 0.4375f}}};
  const std::string file = step + "/model.safetensors";
  std::vector<kvs::StTensor> tensors = kvs::read_safetensors(file);
  int replaced = 0;
  for (auto& t : tensors)
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      if (t.name == p + "k_shift") t = kvs::make_f32_tensor(t.name, {2, 2}, &a[l][0][0]), ++replaced;
      if (t.name == p + "v_shift") t = kvs::make_f32_tensor(t.name, {2, 2}, &b[l][0][0]), ++replaced;
    }
  ASSERT_EQ(replaced, 4);
  kvs::write_safetensors(file, tensors);
  std::filesystem::remove(step + "/manifest.json");  // edited by hand: no longer the checkpoint its manifest describes

  for (const std::string& target : {run, run + "/checkpoints", step}) {
    Result r = run_kvshift("inspect --json --checkpoint " + target);
    ASSERT_EQ(r.code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kv_shift"], true);
    EXPECT_EQ(j["window"], 1);
    EXPECT_EQ(j["columns"], nlohmann::json({"t-1", "t"}));
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 2; ++c) {
          EXPECT_DOUBLE_EQ(j["k_shift"][l][h][c].get<double>(), a[l][h][c]) << l << h << c;
          EXPECT_DOUBLE_EQ(j["v_shift"][l][h][c].get<double>(), b[l][h][c]) << l << h << c;
        }
    const auto& t4 = j["table4"];
    EXPECT_EQ(t4["a_cur_gt_a_prev"]["b_cur_gt_b_prev"], 1);
    EXPECT_EQ(t4["a_cur_gt_a_prev"]["b_cur_le_b_prev"], 1);
    EXPECT_EQ(t4["a_cur_le_a_prev"]["b_cur_gt_b_prev"], 1);
    EXPECT_EQ(t4["a_cur_le_a_prev"]["b_cur_le_b_prev"], 1);
    EXPECT_EQ(t4["total"], 4);
    // a sums: 1.0, 1.0, 1.375, 0.9375; b sums: 1.0, 0.875, 1.75, 0.8125
    EXPECT_DOUBLE_EQ(j["sums"]["k_shift"]["min"].get<double>(), 0.9375);
    EXPECT_DOUBLE_EQ(j["sums"]["k_shift"]["max"].get<double>(), 1.375);
    EXPECT_DOUBLE_EQ(j["sums"]["k_shift"]["mean"].get<double>(), (1.0 + 1.0 + 1.375 + 0.9375) / 4);
    EXPECT_DOUBLE_EQ(j["sums"]["v_shift"]["min"].get<double>(), 0.8125);
    EXPECT_DOUBLE_EQ(j["sums"]["v_shift"]["max"].get<double>(), 1.75);
    EXPECT_DOUBLE_EQ(j["sums"]["v_shift"]["mean"].get<double>(), (1.0 + 0.875 + 1.75 + 0.8125) / 4);
  }

  Result text = run_kvshift("inspect --checkpoint " + run);
  ASSERT_EQ(text.code, 0) << text.out;
  for (const char* part : {"k_shift (a):", "v_shift (b):", "t-1", "L1 H1", "1.5000", "0.0625", "Table 4",
                           "a_cur > a_prev", "b_cur <= b_prev", "min 0.9375"})
    EXPECT_NE(text.out.find(part), std::string::npos) << part << " in:\n" << text.out;
}

// The gate stores a logit; inspect reports the coefficients the model uses.
TEST(Inspect, SigmoidGateReportsEffectiveCoefficients) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp / "run", true, "sigmoid_gate");
  const std::string step = kvs::latest_checkpoint(run + "/checkpoints");
  const std::string file = step + "/model.safetensors";
  std::vector<kvs::StTensor> tensors = kvs::read_safetensors(file);
  const float g[2][2] = {{0.0f, 2.0f}, {0.0f, -1.0f}};  // [unused, logit] per head
  for (auto& t : tensors)
    if (t.name == "model.layers.0.self_attn.k_shift") t = kvs::make_f32_tensor(t.name, {2, 2}, &g[0][0]);
  kvs::write_safetensors(file, tensors);
  std::filesystem::remove(step + "/manifest.json");  // edited by hand: no longer the checkpoint its manifest describes
  Result r = run_kvshift("inspect --json --checkpoint " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const double s0 = 1.0 / (1.0 + std::exp(-2.0)), s1 = 1.0 / (1.0 + std::exp(1.0));
  EXPECT_NEAR(j["k_shift"][0][0][1].get<double>(), s0, 1e-6);
  EXPECT_NEAR(j["k_shift"][0][0][0].get<double>(), 1 - s0, 1e-6);
  EXPECT_NEAR(j["k_shift"][0][1][1].get<double>(), s1, 1e-6);
  for (const char* kind : {"k_shift", "v_shift"})
    for (const auto& layer : j[kind])
      for (const auto& head : layer) EXPECT_NEAR(head[0].get<double>() + head[1].get<double>(), 1.0, 1e-6) << kind;
}

// QKV shifting (shift_q): the query heads' coefficients are reported beside a and b.
TEST(Inspect, QkvShiftReportsTheQueryCoefficients) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp / "run", true, "free", /*shift_q=*/true);
  const std::string step = kvs::latest_checkpoint(run + "/checkpoints");
  std::vector<float> want;
  for (const auto& t : kvs::read_safetensors(step + "/model.safetensors"))
    if (t.name == "model.layers.1.self_attn.q_shift") want = kvs::tensor_to_f32(t);
  ASSERT_EQ(want.size(), 4u);  // [2 query heads, window 1 + 1]
  Result r = run_kvshift("inspect --json --checkpoint " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["q_shift"].size(), 2u);
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(j["q_shift"][1][h][c].get<double>(), want[h * 2 + c]);
  EXPECT_TRUE(j["sums"].contains("q_shift"));
  r = run_kvshift("inspect --checkpoint " + run);
  EXPECT_NE(r.out.find("q_shift (query heads):"), std::string::npos) << r.out;
}

TEST(Inspect, VanillaCheckpointHasNoShiftParameters) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp / "run", false);
  Result r = run_kvshift("inspect --checkpoint " + run);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kv_shift disabled: no shift parameters"), std::string::npos) << r.out;
  Result j = run_kvshift("inspect --json --checkpoint " + run);
  ASSERT_EQ(j.code, 0) << j.out;
  auto js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js["kv_shift"], false);
  EXPECT_EQ(js["message"], "kv_shift disabled: no shift parameters");
}

// Every tensor is checked against the config, as forward and eval check them:
// a missing tensor, or shifts of another window than config.json's, are errors
// (inspect read the window off the tensors and printed another model).
TEST(Inspect, TensorsThatDoNotMatchTheConfigAreErrors) {
  TmpDir tmp;
  const std::string run = train_tiny(tmp / "run", true);
  const std::string step = kvs::latest_checkpoint(run + "/checkpoints");
  ASSERT_FALSE(step.empty());
  std::filesystem::remove(step + "/manifest.json");  // edited by hand below
  const std::string file = step + "/model.safetensors";
  const std::vector<kvs::StTensor> good = kvs::read_safetensors(file);
  std::vector<kvs::StTensor> wider, fewer;
  for (const auto& t : good) {
    if (t.name != "model.layers.1.mlp.up_proj.weight") fewer.push_back(t);
    if (t.name.find("_shift") != std::string::npos) {
      const std::vector<float> three(static_cast<size_t>(t.shape[0]) * 3, 0.5f);
      wider.push_back(kvs::make_f32_tensor(t.name, {t.shape[0], 3}, three.data()));  // a window-2 tensor
    } else {
      wider.push_back(t);
    }
  }
  kvs::write_safetensors(file, fewer);
  Result r = run_kvshift("inspect --checkpoint " + step);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << r.out;
  kvs::write_safetensors(file, wider);
  r = run_kvshift("inspect --checkpoint " + step);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("self_attn.k_shift"), std::string::npos) << r.out;
  kvs::write_safetensors(file, good);
  EXPECT_EQ(run_kvshift("inspect --checkpoint " + step).code, 0);
}

TEST(Inspect, MissingCheckpointIsOneLineError) {
  TmpDir tmp;
  Result r = run_kvshift("inspect --checkpoint " + (tmp / "nope"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("kvshift: error:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nope"), std::string::npos) << r.out;
}
