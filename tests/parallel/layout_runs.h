// `kvshift bench` and `eval` in parallel layouts (test_dist_bench.cpp and
// test_dist_eval.cpp on the CPU engine, test_cuda_bench.cpp and
// test_cuda_eval.cpp on the CUDA one): every layout's numbers must follow one
// process's, with rank 0 alone reporting.
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "dist_test_util.h"

namespace kvs::testing_util {

// A command's JSON: the last line of its output that is one (mpirun may add lines of its own).
inline nlohmann::json last_json(const CommandResult& r) {
  std::istringstream in(r.out);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && (line[0] == '{' || line[0] == '[')) last = line;
  EXPECT_FALSE(last.empty()) << r.out;
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

// `bench --json` of `cfg` on np processes (0: without mpirun): 1 warm-up and 3 timed steps.
inline nlohmann::json bench(int np, const std::string& cfg, const std::string& extra) {
  const auto r = run_kvshift("bench --json --warmup 1 --steps 3 --config " + cfg + " " + extra,
                             np == 0 ? "" : mpirun(np));
  EXPECT_EQ(r.code, 0) << r.out;
  // Rank 0 alone prints: one JSON line, not one per process.
  std::istringstream in(r.out);
  int json_lines = 0;
  for (std::string line; std::getline(in, line);) json_lines += !line.empty() && (line[0] == '{' || line[0] == '[');
  EXPECT_EQ(json_lines, 1) << r.out;
  return last_json(r);
}

// `eval --json` of a run's latest checkpoint on np processes (0: without mpirun).
inline nlohmann::json eval_json(int np, const std::string& run, const std::string& extra = "") {
  const auto r = run_kvshift("eval --json --checkpoint " + run + " " + extra, np == 0 ? "" : mpirun(np));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("\"checkpoint\""), r.out.rfind("\"checkpoint\"")) << "printed more than once: " << r.out;
  return last_json(r);
}

// The layout an eval or bench reports ("parallel") is the one `sets` asked of np processes.
inline void expect_layout(const nlohmann::json& p, int np, const std::string& sets, const std::string& what) {
  EXPECT_EQ(p["processes"], np) << what;
  EXPECT_EQ(p["dp"].get<int>() * p["tp"].get<int>() * p["cp"].get<int>() * p["pp"].get<int>(), np) << what;
  for (const char* k : {"tp", "cp", "pp"})
    EXPECT_EQ(p[k].get<int>(), sets.find(std::string("parallel.") + k + "=2") != std::string::npos ? 2 : 1)
        << what << " " << k;
  EXPECT_EQ(p["sequence_parallel"].get<bool>(), sets.find("sequence_parallel=true") != std::string::npos) << what;
}

struct BenchLayout {
  int np;
  std::string sets;
  int dp, tp, cp, pp;
};

// Each layout's bench reports its layout and the global batch, and its every
// step's loss and gradient norm are one process's within `tol` (relative).
inline void expect_layouts_follow_one_process(const std::string& cfg, const std::vector<BenchLayout>& layouts,
                                              double tol) {
  const nlohmann::json one = bench(0, cfg, "");
  ASSERT_EQ(one["losses"].size(), 4u);
  EXPECT_EQ(one["processes"], 1);
  const int tokens = one["tokens_per_step"].get<int>();
  for (const BenchLayout& l : layouts) {
    const std::string what = fmt::format("np {} {}", l.np, l.sets);
    const nlohmann::json got = bench(l.np, cfg, l.sets);
    ASSERT_TRUE(got.is_object()) << what;
    EXPECT_EQ(got["processes"], l.np) << what;
    EXPECT_EQ(got["parallel"]["dp"], l.dp) << what;
    EXPECT_EQ(got["parallel"]["tp"], l.tp) << what;
    EXPECT_EQ(got["parallel"]["cp"], l.cp) << what;
    EXPECT_EQ(got["parallel"]["pp"], l.pp) << what;
    EXPECT_EQ(got["tokens_per_step"], tokens) << what;  // the global batch, whatever the layout
    EXPECT_NEAR(got["tokens_per_s_per_process"].get<double>() * l.np, got["tokens_per_s"].get<double>(), 1e-6)
        << what;
    ASSERT_EQ(got["losses"].size(), one["losses"].size()) << what;
    double worst = 0;
    for (size_t s = 0; s < one["losses"].size(); ++s) {
      const double loss = rel(got["losses"][s].get<double>(), one["losses"][s].get<double>());
      const double norm = rel(got["grad_norms"][s].get<double>(), one["grad_norms"][s].get<double>());
      worst = std::max({worst, loss, norm});
      EXPECT_LT(loss, tol) << what << " step " << s + 1 << ": " << got["losses"][s] << " vs " << one["losses"][s];
      EXPECT_LT(norm, tol) << what << " gradient norm at step " << s + 1 << ": " << got["grad_norms"][s] << " vs "
                           << one["grad_norms"][s];
    }
    std::printf("[ %s ] max relative difference of the losses and gradient norms: %.3g\n", what.c_str(), worst);
  }
}

}  // namespace kvs::testing_util
