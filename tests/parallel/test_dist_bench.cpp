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
