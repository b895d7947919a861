// `kvshift eval` under mpirun: each rank reads its part of the checkpoint in
// the config's parallel layout (the run's, or --set parallel.*) and the
// data-parallel replicas split the batches; the numbers are one process's,
// and rank 0 alone prints them. One process evaluates a run trained in any
// layout; a layout the world cannot hold is one error.
#include <gtest/gtest.h>

#include "data/shards.h"
#include "layout_runs.h"

using namespace kvs::testing_util;

namespace {

void expect_same_numbers(const nlohmann::json& got, const nlohmann::json& want, const std::string& what) {
  ASSERT_TRUE(got.is_object()) << what;
  EXPECT_LT(rel(got["val_loss"].get<double>(), want["val_loss"].get<double>()), 1e-6)
      << what << ": " << got["val_loss"] << " vs " << want["val_loss"];
  EXPECT_EQ(got["accuracy"], want["accuracy"]) << what;
  EXPECT_EQ(got["scored_tokens"], want["scored_tokens"]) << what;
  EXPECT_EQ(got["sequences"], want["sequences"]) << what;
}

}  // namespace

TEST(DistEval, EveryLayoutGivesOneProcesssNumbers) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  spit(cfg, tiny_config(true, 4).dump());
  train(0, cfg, run, "--set train.steps=10");
  const nlohmann::json one = eval_json(0, run);
  ASSERT_GT(one["scored_tokens"].get<int>(), 0);
  for (const auto& [np, sets] : std::vector<std::pair<int, std::string>>{
           {2, ""},
           {2, "--set parallel.tp=2"},
           {2, "--set parallel.pp=2"},
           {2, "--set parallel.cp=2"},
           {4, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
           {4, "--set parallel.pp=2 --set parallel.tp=2"}}) {
    const std::string what = "np " + std::to_string(np) + " " + sets;
    const nlohmann::json got = eval_json(np, run, sets);
    expect_same_numbers(got, one, what);
    expect_layout(got["parallel"], np, sets, what);  // the same numbers would come from any layout
  }
  EXPECT_EQ(one["parallel"]["processes"], 1);
}

TEST(DistEval, ARunTrainedInALayoutEvaluatesInOneProcess) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  spit(cfg, tiny_config(false, 4).dump());
  train(2, cfg, run, "--set train.steps=6 --set parallel.tp=2");  // run_config.json says tp 2
  const nlohmann::json one = eval_json(0, run);
  EXPECT_EQ(one["parallel"]["tp"], 1);  // one process holds the whole model
  const nlohmann::json two = eval_json(2, run);
  expect_same_numbers(two, one, "np 2, the run's tp 2");
  EXPECT_EQ(two["parallel"]["tp"], 2);
  EXPECT_EQ(two["parallel"]["dp"], 1);
}

TEST(DistEval, LayoutTheWorldCannotHoldIsOneError) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  spit(cfg, tiny_config(false, 4).dump());
  train(0, cfg, run, "--set train.steps=2");
  const auto r = run_kvshift("eval --checkpoint " + run + " --set parallel.tp=2", mpirun(3));
  EXPECT_NE(r.code, 0) << r.out;
  const std::string msg = "parallel.tp (2) must divide the number of processes (3)";
  EXPECT_NE(r.out.find(msg), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(msg), r.out.rfind(msg)) << "reported more than once: " << r.out;
}

// Blended shards: each source's numbers too are one process's in every layout
// (the last stage's per-token losses, summed over the stages and the replicas).
TEST(DistEval, BlendedDataGivesOneProcesssNumbersPerSource) {
  TmpDir tmp;
  std::vector<uint32_t> web(3000), code(3000);
  for (uint32_t i = 0; i < 3000; ++i) {
    web[i] = 64 + (i * 7919u) % 336;  // hard to predict
    code[i] = 64 + i % 11;             // easy
  }
  kvs::write_shard(tmp / "web.bin", web, 2);
  kvs::write_shard(tmp / "code.bin", code, 2);
  nlohmann::json c = tiny_config(true, 4);
  c["data"] = {{"type", "shards"},
               {"shards", {{"train", nlohmann::json::array({tmp / "web.bin", tmp / "code.bin"})},
                               {"weights", {2, 1}},
                               {"val_fraction", 0.1}}}};
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  spit(cfg, c.dump());
  train(0, cfg, run, "--set train.steps=10");
  const nlohmann::json one = eval_json(0, run);
  ASSERT_EQ(one["sources"].size(), 2u) << one;
  EXPECT_GT(std::abs(one["sources"]["web.bin"]["val_loss"].get<double>() -
                     one["sources"]["code.bin"]["val_loss"].get<double>()),
            0.1);
  for (const auto& [np, sets] : std::vector<std::pair<int, std::string>>{
           {2, ""}, {2, "--set parallel.pp=2"}, {2, "--set parallel.tp=2"}}) {
    const std::string what = "np " + std::to_string(np) + " " + sets;
    const nlohmann::json got = eval_json(np, run, sets);
    expect_same_numbers(got, one, what);
    for (const char* s : {"web.bin", "code.bin"}) {
      ASSERT_TRUE(got["sources"].contains(s)) << what << ": " << got;
      expect_same_numbers(got["sources"][s], one["sources"][s], what + ", " + s);
    }
  }
}
