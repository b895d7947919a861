// Throughput on the CUDA engine: `kvshift bench --device cuda` in parallel
// layouts (under mpirun, ranks sharing one GPU with the MPI backend, as
// test_cuda_tp.cpp's runs: every layout's steps follow one process's and rank
// 0 alone reports; layout_runs.h), and MFU in bench, metrics.jsonl and the
// progress line. Skipped without a GPU; runs on the host-built engine in CI;
// run on an H200 (2026-11-29, docs/CUDA.md).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "layout_runs.h"
#include "cuda_test_util.h"

using namespace kvs::testing_util;

TEST(CudaBench, EveryLayoutTimesTheStepOfOneProcess) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  // bf16 activations summed in other orders: on the host build tp = 2 moves a
  // loss or gradient norm by up to 2.6e-4 and cp = 2 by 1e-4, dp and pp by
  // 6e-10 at most. A replica reading another's sequences moved the CPU
  // engine's gradient norm by 40%.
  expect_layouts_follow_one_process(cfg,
                                    {{2, "", 2, 1, 1, 1},
                                     {2, "--set parallel.tp=2", 1, 2, 1, 1},
                                     {2, "--set parallel.cp=2", 1, 1, 2, 1},
                                     {2, "--set parallel.pp=2", 1, 1, 1, 2}},
                                    2e-3);
}

// MFU is model TFLOP/s per process over the GPU's dense bf16 peak (here set by
// KVS_PEAK_TFLOPS, which also names it for a GPU kvshift does not know): in
// bench's JSON, in every train line of metrics.jsonl and on the progress line.
TEST(CudaBench, TrainAndBenchReportMfuAgainstThePeak) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  const std::string peak = "env KVS_PEAK_TFLOPS=0.002";
  const nlohmann::json b = last_json(run_kvshift("bench --json --warmup 1 --steps 2 --config " + cfg, peak));
  ASSERT_TRUE(b.contains("mfu")) << b.dump();
  EXPECT_NEAR(b["mfu"].get<double>(), b["model_tflops_per_s"].get<double>() / 0.002, 1e-9);
  const auto r = run_kvshift("train --config " + cfg + " --run-dir " + (tmp / "run") +
                                 " --set train.steps=3 --set train.log_every=1",
                             peak);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(step 3/3 \| .* tok/s \| ETA \S+ \| MFU [0-9.]+%)"))) << r.out;
  int lines = 0;
  std::ifstream in(tmp / "run/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] != "train") continue;
    ++lines;
    ASSERT_TRUE(j.contains("mfu")) << line;
    EXPECT_NEAR(j["mfu"].get<double>(), j["model_tflops_per_s"].get<double>() / 0.002, 1e-9) << line;
  }
  EXPECT_EQ(lines, 3);
}

// --compare-overlap: train.overlap_optimizer off and on in one run. The
// update's bits do not depend on it, so both runs give every step's loss and
// gradient norm bit for bit (a step reading a layer's weights before its
// update moves them); the text names both and prints the ratio. On the CPU it
// is a one-line error.
TEST(CudaBench, CompareOverlapTimesAdamWInOrderAndOverlappedWithTheSameLosses) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  const auto j = run_kvshift("bench --json --warmup 1 --steps 2 --compare-overlap --config " + cfg);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto arr = nlohmann::json::parse(j.out.substr(j.out.find('[')));
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_FALSE(arr[0]["overlap_optimizer"].get<bool>());
  EXPECT_TRUE(arr[1]["overlap_optimizer"].get<bool>());
  ASSERT_EQ(arr[0]["losses"].size(), 3u);
  EXPECT_EQ(arr[1]["losses"], arr[0]["losses"]);
  EXPECT_EQ(arr[1]["grad_norms"], arr[0]["grad_norms"]);
  EXPECT_NE(arr[0]["losses"][0], arr[0]["losses"][2]) << "the steps changed nothing";
  const auto t = run_kvshift("bench --warmup 0 --steps 1 --compare-overlap --config " + cfg);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find(", AdamW after the step\n"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find(", AdamW overlapping the next forward\n"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("AdamW overlapping the next forward: "), std::string::npos) << t.out;
  const auto cpu = run_kvshift("bench --device cpu --compare-overlap --config " + cfg);
  EXPECT_NE(cpu.code, 0);
  EXPECT_NE(cpu.out.find("bench: --compare-overlap times the CUDA engine's overlapped AdamW; this run's device is "
                         "cpu"),
            std::string::npos)
      << cpu.out;
}

// bench-gemm: every projection's three GEMMs under bench --profile's names,
// each with the algorithms the heuristic offers, and the micro-batch's total.
TEST(CudaBench, BenchGemmTimesEveryGemmOfAMicroBatch) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  const auto r = run_kvshift("bench-gemm --algos 2 --reps 1 --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* proj : {"qkv proj", "o proj", "gate,up proj", "down proj", "lm head"})
    for (const char* pass : {" fwd ", " bwd dinp ", " bwd dW "})
      EXPECT_NE(r.out.find(std::string("\n") + proj + pass), std::string::npos) << proj << pass << "\n" << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(a micro-batch's GEMMs .*: [0-9.]+x\n)"))) << r.out;
  const auto bad = run_kvshift("bench-gemm --algos 0 --config " + cfg);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("bench-gemm: --algos and --reps must be >= 1"), std::string::npos) << bad.out;
}

#endif  // KVS_CUDA
