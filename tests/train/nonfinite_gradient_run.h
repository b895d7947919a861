// A run whose step `bad` has non-finite gradients and a finite loss
// (KVS_FAULT_INF_GRADIENT_STEP scales that step's gradients by +inf on the last
// data-parallel rank): it must stop on the gradient norm, before that step's
// optimizer update and checkpoint, naming the step and the intact checkpoint;
// resumed without the fault, its losses and evaluation are the uninterrupted
// run's bits (nothing of the bad step reached the weights, the moments or the
// metrics). Shared by the CPU engine's tests (tests/train) and the host-built
// CUDA engine's (tests/cuda_host).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace kvs::testing_util {

// `c` needs more than `bad` steps; `comm` null: one process.
inline void expect_nonfinite_gradient_stops_cleanly(Config c, int bad, const std::string& full_dir,
                                              const std::string& dir, dist::Communicator* comm = nullptr) {
  ASSERT_GT(c.train.steps, bad);
  c.train.checkpoint_every = 1;
  const TrainSummary full = train(c, {full_dir, false, true, comm});
  ASSERT_EQ(::setenv("KVS_FAULT_INF_GRADIENT_STEP", std::to_string(bad).c_str(), 1), 0);
  std::string message;
  try {
    train(c, {dir, false, true, comm});
    ADD_FAILURE() << "the run did not stop";
  } catch (const Error& e) {
    message = e.what();
  }
  ::unsetenv("KVS_FAULT_INF_GRADIENT_STEP");
  const std::string kept = fmt::format("{}/checkpoints/step_{:08d}", dir, bad - 1);
  EXPECT_TRUE(std::regex_match(
      message, std::regex(fmt::format("step {}: gradient norm is -?(nan|inf) — stopping; the last checkpoint "
                                      "\\({}\\) is intact",
                                      bad, kept))))
      << message;
  EXPECT_EQ(latest_checkpoint(dir + "/checkpoints"), kept);
  const TrainSummary rest = train(c, {dir, true, true, comm});
  ASSERT_EQ(rest.losses.size(), static_cast<size_t>(c.train.steps - bad + 1));
  for (size_t i = 0; i < rest.losses.size(); ++i)
    EXPECT_EQ(rest.losses[i], full.losses[bad - 1 + i]) << "step " << bad + i;
  EXPECT_EQ(rest.final_eval.loss, full.final_eval.loss);
}

}  // namespace kvs::testing_util
