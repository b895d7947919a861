// Training on the host-built CUDA engine through the trainer (device "cuda":
// make_engine builds it, as on a GPU): 5 steps follow the CPU engine's loss
// curve, two runs are bit-identical, and a run saved after 2 steps and
// resumed is bit-identical to the uninterrupted one (checkpoint write and
// read of the engine's parameters and AdamW moments). The GPU test's model
// and tolerance (tests/model/test_cuda_engine.cpp: 5% of the CPU loss), with
// 5 steps instead of 50 and micro-batches of 4 x 16 tokens instead of 8 x 32
// (time under the emulator).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "hostcuda.h"
#include "model/config.h"
#include "train/nonfinite_gradient_run.h"
#include "train/trainer.h"

namespace {

kvs::Config tiny_training(const char* device, bool shift, int steps) {
  nlohmann::json j = {
      {"name", "cuda-host-tiny"},
      {"device", device},
      {"model",
       {{"hidden_size", 64},
        {"intermediate_size", 128},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", 64},
        {"max_position_embeddings", 32},
        {"kv_shift", {{"enabled", shift}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 64}, {"pool_size", 16}}}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 4},
        {"grad_accum_steps", 2},
        {"steps", steps},
        {"lr", 3e-3},
        {"warmup_steps", 2},
        {"eval_every", 0},
        {"eval_sequences", 8},
        {"checkpoint_every", 0},
        {"threads", 2}}}};
  kvs::Config c = kvs::config_from_json(j, "cuda-host-tiny");
  kvs::validate(c, "cuda-host-tiny");
  return c;
}

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "kvs_cuda_host_" + name;
  std::filesystem::remove_all(d);
  return d;
}

}  // namespace

TEST(HostCudaTraining, FiveStepsFollowTheCpuLossCurveAndRepeatBitForBit) {
  for (bool shift : {true, false}) {
    SCOPED_TRACE(shift ? "shifted" : "vanilla");
    const uint64_t kernels = hostcuda::stats().kernels;
    auto cpu = kvs::train(tiny_training("cpu", shift, 5), {fresh("cpu"), false, true});
    auto a = kvs::train(tiny_training("cuda", shift, 5), {fresh("a"), false, true});
    EXPECT_GT(hostcuda::stats().kernels - kernels, 300u) << "the cuda run did not use the host engine";
    auto b = kvs::train(tiny_training("cuda", shift, 5), {fresh("b"), false, true});
    ASSERT_EQ(a.losses.size(), 5u);
    ASSERT_EQ(a.losses.size(), cpu.losses.size());
    for (size_t i = 0; i < cpu.losses.size(); ++i)
      EXPECT_NEAR(a.losses[i], cpu.losses[i], 0.05 * cpu.losses[i]) << "step " << i + 1;
    EXPECT_LT(a.losses.back(), a.losses.front()) << "no learning in 5 steps";
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.final_eval.loss, b.final_eval.loss);
    EXPECT_EQ(a.final_eval.accuracy, b.final_eval.accuracy);
    EXPECT_NEAR(a.final_eval.loss, cpu.final_eval.loss, 0.05 * cpu.final_eval.loss);
  }
}

TEST(HostCudaTraining, ResumeIsBitIdentical) {
  const kvs::Config c = tiny_training("cuda", true, 5);
  auto full = kvs::train(c, {fresh("full"), false, true});
  const std::string dir = fresh("resumed");
  kvs::Config head = c;
  head.train.steps = 2;
  kvs::train(head, {dir, false, true});
  auto rest = kvs::train(c, {dir, true, true});
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.losses[i], full.losses[2 + i]) << "step " << 3 + i;
  EXPECT_EQ(rest.final_eval.loss, full.final_eval.loss);
}

// Non-finite gradients (scaled in the engine's own backward) under a finite loss at
// step 3 of 4: stopped on the gradient norm before the update (the device
// norm must not drop a NaN), resumed bit-identically.
TEST(HostCudaTraining, NonFiniteGradientStopsBeforeTheUpdate) {
  kvs::testing_util::expect_nonfinite_gradient_stops_cleanly(tiny_training("cuda", true, 4), 3, fresh("bad_grad_full"),
                                                       fresh("bad_grad"));
}
