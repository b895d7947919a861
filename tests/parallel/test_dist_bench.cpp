// `kvshift bench` times the training step in the config's parallel layout:
// under mpirun every layout's steps follow one process's (the same global
// batch, the same losses and gradient norms), rank 0 alone reports, with the
// layout and per-process figures; a layout the world cannot hold is one error.
#include <gtest/gtest.h>

#include "layout_runs.h"

using namespace kvs::testing_util;

TEST(DistBench, EveryLayoutTimesTheStepOfOneProcess) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  expect_layouts_follow_one_process(cfg,
                                    {{2, "", 2, 1, 1, 1},
                                     {2, "--set parallel.tp=2", 1, 2, 1, 1},
                                     {2, "--set parallel.cp=2", 1, 1, 2, 1},
                                     {2, "--set parallel.pp=2", 1, 1, 1, 2},
                                     {4, "--set parallel.tp=2 --set parallel.sequence_parallel=true", 2, 2, 1, 1}},
                                    1e-5);
}

TEST(DistBench, TextNamesTheLayoutAndPerProcessFigures) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(false, 4).dump());
  const auto r = run_kvshift("bench --warmup 1 --steps 2 --config " + cfg + " --set parallel.tp=2", mpirun(2));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("on 2 processes (dp 1, tp 2), each on cpu (1 threads)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" per process) | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model TFLOP/s per process"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak memory (host RSS, the largest process's) "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("median"), r.out.rfind("median")) << "reported more than once: " << r.out;
}

TEST(DistBench, LayoutTheWorldCannotHoldIsOneError) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(false, 4).dump());
  // One process cannot hold tp = 2: an error, not a benchmark of the unsplit model.
  auto r = run_kvshift("bench --steps 1 --config " + cfg + " --set parallel.tp=2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kvshift: error: parallel.tp (2) must divide the number of processes (1)"), std::string::npos)
      << r.out;
  r = run_kvshift("bench --steps 1 --config " + cfg + " --set parallel.tp=2", mpirun(3));
  EXPECT_NE(r.code, 0) << r.out;
  const std::string msg = "parallel.tp (2) must divide the number of processes (3)";
  EXPECT_NE(r.out.find(msg), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(msg), r.out.rfind(msg)) << "reported more than once: " << r.out;
}

// --compare-shift builds, times and frees one training step per config on the same world, one
// after the other: under mpirun each follows one process's run of the same config.
TEST(DistBench, CompareShiftInALayout) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_config(true, 4).dump());
  const nlohmann::json one = bench(0, cfg, "--compare-shift");
  const nlohmann::json two = bench(2, cfg, "--compare-shift --set parallel.tp=2");
  ASSERT_TRUE(one.is_array() && two.is_array()) << one.dump() << two.dump();
  ASSERT_EQ(two.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(two[i]["kv_shift"], i == 1);
    EXPECT_EQ(two[i]["parallel"]["tp"], 2);
    ASSERT_EQ(two[i]["losses"].size(), one[i]["losses"].size());
    for (size_t s = 0; s < one[i]["losses"].size(); ++s)
      EXPECT_LT(rel(two[i]["losses"][s].get<double>(), one[i]["losses"][s].get<double>()), 1e-5)
          << "kv_shift " << (i == 1) << " step " << s + 1;
  }
  EXPECT_NE(one[0]["losses"], one[1]["losses"]);  // two models, not one timed twice
}
