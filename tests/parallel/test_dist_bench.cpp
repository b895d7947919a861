// `kvshift bench` times the training step in the config's parallel layout:
// under mpirun every layout's steps follow one process's (the same global
// batch, the same losses and gradient norms), rank 0 alone reports, with the
// layout and per-process figures; a layout the world cannot hold is one error.
#include <gtest/gtest.h>

#include "layout_runs.h"
#include "model/config.h"
#include "model/params.h"

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
  EXPECT_NE(r.out.find("on 2 processes (dp 1, tp 2), each on cpu (1 thread)"), std::string::npos) << r.out;
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

// ZeRO-1 saves memory on the CPU engine too. A rank of dp 2 holds half of
// the two moments, so it sheds as many bytes as the fp32 parameters take (156
// MiB here: 36M parameters, 1 x 32 tokens per micro-batch, so the weights,
// gradients and moments are most of the process); it spends about 24 MiB on
// the collectives' staging and about 40 MiB on the MPI library. Measured: one
// process 838 MiB, a rank of dp 2 744 MiB; required: at least a quarter of
// the parameters' size below. Before, each rank held a dp x S host copy of the
// gradients and allocated the whole moments before narrowing them: a rank of
// dp 2 peaked at 1,030 MiB (either fix alone: 1,082 and 900 MiB).
TEST(DistBench, Zero1RankPeaksBelowOneProcess) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  nlohmann::json c = tiny_config(true, 2);
  c["model"].update({{"hidden_size", 768}, {"intermediate_size", 2048}, {"num_hidden_layers", 4},
                     {"num_attention_heads", 6}, {"num_key_value_heads", 6}, {"vocab_size", 8192},
                     {"max_position_embeddings", 32}});
  c["train"].update({{"seq_len", 32}, {"micro_batch_size", 1}});
  spit(cfg, c.dump());
  const nlohmann::json one = bench(0, cfg, ""), two = bench(2, cfg, "");
  ASSERT_EQ(two["parallel"]["dp"], 2);
  const kvs::ParamCounts n = kvs::count_params(kvs::config_from_json(c, "c").model);
  const double params_mib = 4.0 * static_cast<double>(n.total) / (1 << 20);
  const double one_mib = one["peak_rss_mib"].get<double>(), two_mib = two["peak_rss_mib"].get<double>();
  EXPECT_LT(two_mib, one_mib - 0.25 * params_mib)
      << "one process " << one_mib << " MiB, a rank of dp 2 " << two_mib << " MiB, fp32 parameters " << params_mib
      << " MiB";
}
