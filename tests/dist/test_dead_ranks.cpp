// Dead, hung and signalled ranks under mpirun (docs/RELIABILITY.md): a rank
// that hangs outside MPI makes the others stop within KVS_COLLECTIVE_TIMEOUT_S
// with one line naming it and the collective; a rank that exits ends the job;
// SIGUSR1 to mpirun stops every rank after the same step with a checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "build_paths.h"
#include "parallel/dist_test_util.h"
#include "train/checkpoint.h"

using namespace kvs::testing_util;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// Starts `cmd` under sh in its own process group and returns the pid of what
// it execs (sh's `exec` keeps the pid, so with an mpirun command it is mpirun).
pid_t start_in_background(const std::string& cmd) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits (at most about a minute) until the run's metrics.jsonl holds more than `bytes`.
void wait_for_metrics(const std::string& run, uintmax_t bytes) {
  const std::string metrics = run + "/metrics.jsonl";
  for (int i = 0; i < 60000 && !(fs::exists(metrics) && fs::file_size(metrics) > bytes); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Waits (at most a minute) for background job `pid` to exit, into `status`;
// false if it had to be killed (a hang).
bool exited_within_a_minute(pid_t pid, int& status) {
  for (int i = 0; i < 6000; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return false;
}

}  // namespace

TEST(DeadRanks, AHungRankIsNamedWithinTheCollectiveTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_kvshift("dist-selftest --stall-rank 1 --stall-s 100", "KVS_COLLECTIVE_TIMEOUT_S=2 " + mpirun(3));
  const double s = seconds_since(t0);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_LT(s, 30) << r.out;
  EXPECT_NE(r.out.find("MPI all_reduce (collective #1) did not complete within 2 s (KVS_COLLECTIVE_TIMEOUT_S): "
                       "rank 1 did not answer (dead, or stuck outside MPI)"),
            std::string::npos)
      << r.out;
}

// Stuck after the last collective: MPI_Finalize would wait for it with no
// deadline (measured: the run lasted as long as the stall, forever for a
// SIGSTOPped rank), so every command ends in a barrier under the deadline.
TEST(DeadRanks, ARankStuckAfterTheLastCollectiveIsNamed) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r =
      run_kvshift("dist-selftest --stall-rank 1 --stall-at-end --stall-s 100", "KVS_COLLECTIVE_TIMEOUT_S=2 " + mpirun(2));
  const double s = seconds_since(t0);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_LT(s, 30) << r.out;
  EXPECT_NE(r.out.find("MPI barrier (collective #10) did not complete within 2 s (KVS_COLLECTIVE_TIMEOUT_S): "
                       "rank 1 did not answer (dead, or stuck outside MPI)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("dist-selftest: 2 ranks, backend mpi: ok"), std::string::npos) << r.out;
}

TEST(DeadRanks, ARankThatExitsEndsTheJob) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_kvshift("dist-selftest --exit-rank 1", "KVS_COLLECTIVE_TIMEOUT_S=5 " + mpirun(2));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out (hang): " << r.out;
  EXPECT_LT(seconds_since(t0), 30) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

// SIGUSR1 to mpirun (which forwards it to every rank): all ranks finish the
// same step, rank 0 writes one checkpoint and says so once, every rank exits
// 75; the resumed run then follows the uninterrupted curve.
TEST(DeadRanks, SigusrToMpirunStopsEveryRankAfterTheSameStep) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run", ref = tmp / "ref";
  nlohmann::json c = tiny_config(true, 4);
  c["train"]["steps"] = 4000;
  c["train"]["checkpoint_every"] = 0;
  spit(cfg, c.dump());
  // No `timeout` in front: `exec` keeps the pid through sh and env, so `pid` is mpirun itself.
  std::string launcher = mpirun(2);
  launcher.replace(launcher.find("timeout 120 "), 12, "");
  const std::string cmd = launcher + " " + kvs::test::cli_binary() + " train --quiet --config " + cfg +
                          " --run-dir " + run + " > " + (tmp / "out.txt") + " 2>&1";
  const pid_t pid = start_in_background(cmd);
  wait_for_metrics(run, 200);
  ::kill(pid, SIGUSR1);
  int st = 0;
  if (!exited_within_a_minute(pid, st)) FAIL() << "mpirun did not stop after SIGUSR1: " << slurp(tmp / "out.txt");
  const std::string out = slurp(tmp / "out.txt");
  ASSERT_TRUE(WIFEXITED(st)) << out;
  EXPECT_EQ(WEXITSTATUS(st), 75) << out;
  EXPECT_EQ(count(out, "kvshift: stopped by SIGUSR1 after step "), 1) << out;
  const std::string latest = kvs::latest_checkpoint(run + "/checkpoints");
  ASSERT_FALSE(latest.empty()) << out;
  const int step = std::stoi(latest.substr(latest.size() - 8));
  EXPECT_NE(out.find("after step " + std::to_string(step) + "; checkpoint " + latest), std::string::npos) << out;
  // Resume to a few steps past the stop and compare with an uninterrupted run of that length.
  const std::string more = " --set train.steps=" + std::to_string(step + 3);
  train(2, cfg, run, "--resume" + more);
  train(2, cfg, ref, more);
  const Curve a = read_metrics(run), b = read_metrics(ref);
  EXPECT_EQ(a.train, b.train);
}

namespace {

// The kvshift process of world rank `rank` among the children of mpirun `pid`.
pid_t rank_pid(pid_t mpirun, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != mpirun) continue;
    std::string env = slurp(e.path().string() + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (env.find("\nOMPI_COMM_WORLD_RANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

}  // namespace

// A rank held up in its own work (SIGSTOP for a second and a half) is named in
// metrics.jsonl's straggler line; a stop while it waits in a collective counts
// as waiting, so the pause is repeated until one lands in its work.
TEST(DeadRanks, ASlowRankIsNamedInMetrics) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  nlohmann::json c = tiny_config(true, 4);
  c["train"]["steps"] = 100000;
  c["train"]["checkpoint_every"] = 0;
  // Wide enough that a step is mostly the rank's own work, not waiting in collectives.
  c["model"]["hidden_size"] = 256;
  c["model"]["intermediate_size"] = 1024;
  spit(cfg, c.dump());
  std::string launcher = mpirun(2);
  launcher.replace(launcher.find("timeout 120 "), 12, "");
  const std::string cmd = launcher + " " + kvs::test::cli_binary() + " train --quiet --config " + cfg +
                          " --run-dir " + run + " > " + (tmp / "out.txt") + " 2>&1";
  const pid_t pid = start_in_background(cmd);
  wait_for_metrics(run, 3000);
  const pid_t r1 = rank_pid(pid, 1);
  bool named = false;
  for (int attempt = 0; attempt < 6 && r1 > 0 && !named; ++attempt) {
    ::kill(r1, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ::kill(r1, SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::ifstream in(run + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("type", "") == "straggler" && j.value("slow_rank", false) &&
          j.value("slowest_rank", -1) == 1 && j.value("slowest_rank_work_s", 0.0) > 1.0)
        named = true;
    }
  }
  ::kill(pid, SIGUSR1);
  int st = 0;
  exited_within_a_minute(pid, st);
  ASSERT_GT(r1, 0) << "rank 1's process not found under mpirun " << pid;
  EXPECT_TRUE(named) << slurp(tmp / "out.txt");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 75) << slurp(tmp / "out.txt");
}

// SIGTERM to one rank (not rank 0) during a long evaluation: every rank asks
// the others before each round of micro-batches, so all abandon it at the
// same round (replicas with fewer micro-batches, pipeline stages alike), rank
// 0 writes the step's checkpoint, every rank exits 75, and the resume follows
// the uninterrupted curve.
TEST(DeadRanks, AStopSignalToOneRankAbandonsTheEvaluationOnEveryRank) {
  for (const std::string layout : {"", " --set parallel.pp=2"}) {
    SCOPED_TRACE(layout);
    TmpDir tmp;
    const std::string cfg = tmp / "c.json", run = tmp / "run", ref = tmp / "ref";
    nlohmann::json c = tiny_config(true, 4);
    c["train"]["steps"] = 3;
    c["train"]["log_every"] = 1;
    c["train"]["eval_every"] = 1;
    c["train"]["eval_sequences"] = 199999;  // minutes of evaluation; odd: the replicas' shares differ
    c["train"]["checkpoint_every"] = 0;
    spit(cfg, c.dump());
    std::string launcher = mpirun(2);
    launcher.replace(launcher.find("timeout 120 "), 12, "");
    const std::string cmd = launcher + " " + kvs::test::cli_binary() + " train --quiet --config " + cfg +
                            " --run-dir " + run + layout + " > " + (tmp / "out.txt") + " 2>&1";
    const pid_t pid = start_in_background(cmd);
    wait_for_metrics(run, 0);  // step 1's train line: its evaluation follows
    const pid_t r1 = rank_pid(pid, 1);
    if (r1 > 0) ::kill(r1, SIGTERM);
    int st = 0;
    if (!exited_within_a_minute(pid, st))
      FAIL() << "mpirun did not stop within a minute of SIGTERM to rank 1: " << slurp(tmp / "out.txt");
    const std::string out = slurp(tmp / "out.txt");
    ASSERT_GT(r1, 0) << "rank 1's process not found under mpirun " << pid;
    ASSERT_TRUE(WIFEXITED(st)) << out;
    EXPECT_EQ(WEXITSTATUS(st), 75) << out;
    EXPECT_EQ(count(out, "eval @ step 1: abandoned after SIGTERM"), 1) << out;
    EXPECT_EQ(count(out, "kvshift: stopped by SIGTERM after step 1; checkpoint "), 1) << out;
    EXPECT_EQ(kvs::latest_checkpoint(run + "/checkpoints"), run + "/checkpoints/" + kvs::checkpoint_dir_name(1));
    EXPECT_TRUE(read_metrics(run).eval.empty()) << slurp(run + "/metrics.jsonl");
    const std::string short_eval = layout + " --set train.eval_sequences=8";
    train(2, cfg, run, "--resume" + short_eval);
    train(2, cfg, ref, short_eval);
    const Curve a = read_metrics(run);
    Curve b = read_metrics(ref);
    EXPECT_EQ(a.train, b.train);
    b.eval.erase(1);  // step 1's evaluation was abandoned
    EXPECT_EQ(a.eval, b.eval);
  }
}

// Pipeline stages do different work (the last holds the LM head: here a
// 32k vocabulary, about 15x the first stage's work), so a rank is compared
// with its own stage's ranks only: a healthy pp 2 run has no slow rank (each
// stage alone: nothing to compare with; before, the last stage was flagged on
// 9 of 10 steps).
TEST(DeadRanks, PipelineStagesAreComparedWithinAStage) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  nlohmann::json c = tiny_config(true, 4);
  c["model"]["hidden_size"] = 64;
  c["model"]["intermediate_size"] = 128;
  c["model"]["vocab_size"] = 32768;
  c["model"]["max_position_embeddings"] = 32;
  c["train"]["seq_len"] = 32;
  c["train"]["micro_batch_size"] = 8;
  c["train"]["steps"] = 10;
  c["train"]["eval_every"] = 0;
  c["train"]["checkpoint_every"] = 0;
  spit(cfg, c.dump());
  const kvs::testing_util::CommandResult r = kvs::testing_util::run_kvshift(
      "train --quiet --config " + cfg + " --run-dir " + run + " --set parallel.pp=2", mpirun(2));
  const std::string& out = r.out;
  EXPECT_EQ(r.code, 0) << out;
  std::ifstream in(run + "/metrics.jsonl");
  int slow = 0, steps = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    steps += j.value("type", "") == "train";
    slow += j.value("type", "") == "straggler" && j.value("slow_rank", false);
  }
  EXPECT_EQ(steps, 10) << out;
  EXPECT_EQ(slow, 0) << out;
}

// Ranks launched with different configs (one rank's override differs: under pp
// a truncated receive corrupted the heap, under dp another model trained
// silently) stop before any work with one line on each rank.
TEST(DeadRanks, RanksWithDifferentConfigsStopBeforeAnyWork) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  spit(cfg, tiny_config(true, 4).dump());
  const std::string train = "train --quiet --config " + cfg + " --run-dir " + run + " --set parallel.pp=2";
  // Two app contexts: "mpirun ... -np 1 kvshift <train> : -np 1 kvshift <train with another lr>".
  const kvs::testing_util::CommandResult r = kvs::testing_util::run_kvshift(
      train + " --set train.lr=0.02", mpirun(1) + " " + kvs::test::cli_binary() + " " + train + " : -np 1");
  const std::string& out = r.out;
  EXPECT_NE(r.code, 0) << out;
  EXPECT_NE(out.find("the ranks were started with different configs"), std::string::npos) << out;
  EXPECT_EQ(out.find("corrupted"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl") && fs::file_size(run + "/metrics.jsonl") > 0) << out;
}

// Ranks started from different weights (--init-from or --resume on one side of
// a launch, different checkpoints, per-node run directories holding other runs
// at the same step) trained a mix of two models silently (ZeRO-1's all-gather
// stitched the shards together); bench with another config on one rank timed
// two configs as one. Each now stops before any work with one line.
TEST(DeadRanks, RanksStartedFromDifferentWeightsStopBeforeAnyWork) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  nlohmann::json c = tiny_config(true, 2);
  c["train"]["steps"] = 2;
  c["train"]["checkpoint_every"] = 2;
  c["train"]["eval_every"] = 0;
  spit(cfg, c.dump());
  const std::string train = "train --quiet --config " + cfg;
  for (const char* seed : {"1", "2"}) {
    const auto r = run_kvshift(train + " --set train.seed=" + seed + " --run-dir " + (tmp / ("one" + std::string(seed))));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  const std::string a = tmp / "one1/checkpoints/step_00000002", b = tmp / "one2/checkpoints/step_00000002";
  auto mpmd = [&](const std::string& rank0, const std::string& rank1) {
    return run_kvshift(rank1, mpirun(1) + " " + kvs::test::cli_binary() + " " + rank0 + " : -np 1");
  };
  const std::string fresh = train + " --run-dir " + (tmp / "run");
  auto r = mpmd(fresh + " --init-from " + a, fresh);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the ranks were started differently (this rank: "), std::string::npos) << r.out;
  r = mpmd(fresh + " --init-from " + a, fresh + " --init-from " + b);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the ranks were given different checkpoints"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "run/metrics.jsonl") && fs::file_size(tmp / "run/metrics.jsonl") > 0) << r.out;
  // Copies of one checkpoint agree (per-node copies of the same files).
  fs::copy(a, tmp / "copy_of_a", fs::copy_options::recursive);
  r = mpmd(fresh + "_ok --init-from " + a, fresh + "_ok --init-from " + (tmp / "copy_of_a"));
  EXPECT_EQ(r.code, 0) << r.out;
  // Per-rank run directories with other runs at the same step.
  fs::copy(tmp / "one1", tmp / "rA", fs::copy_options::recursive);
  fs::copy(tmp / "one2", tmp / "rB", fs::copy_options::recursive);
  const std::string longer = train + " --set train.steps=4 --resume --run-dir ";
  r = mpmd(longer + (tmp / "rA"), longer + (tmp / "rB"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the ranks chose checkpoints of the same step 2 with different contents"), std::string::npos)
      << r.out;
  // bench with another config on one rank.
  const std::string bench = "bench --json --warmup 0 --steps 1 --config " + cfg;
  r = mpmd(bench + " --set train.lr=0.02", bench);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the ranks were started with different configs"), std::string::npos) << r.out;
}

// A pipeline stage that hangs mid-step (SIGSTOP, never continued): the other
// stage, waiting for its activations or gradients, stops within the
// collective timeout with one line naming it, instead of waiting forever.
TEST(DeadRanks, AHungPipelineStageIsNamedWithinTheTimeout) {
  TmpDir tmp;
  const std::string cfg = tmp / "c.json", run = tmp / "run";
  nlohmann::json c = tiny_config(true, 4);
  c["train"]["steps"] = 100000;
  c["train"]["checkpoint_every"] = 0;
  spit(cfg, c.dump());
  std::string launcher = mpirun(2);
  launcher.replace(launcher.find("timeout 120 "), 12, "");
  launcher.replace(launcher.find("env "), 4, "env KVS_COLLECTIVE_TIMEOUT_S=2 ");
  const std::string cmd = launcher + " " + kvs::test::cli_binary() + " train --quiet --config " + cfg +
                          " --run-dir " + run +
                          " --set parallel.pp=2 > " + (tmp / "out.txt") + " 2>&1";
  const pid_t pid = start_in_background(cmd);
  wait_for_metrics(run, 2000);
  const pid_t r1 = rank_pid(pid, 1);
  if (r1 > 0) ::kill(r1, SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  bool ended = false;
  for (int i = 0; i < 3000 && !ended; ++i) {  // 30 s
    ended = ::waitpid(pid, &st, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double waited = seconds_since(t0);
  if (!ended) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &st, 0);
  }
  if (r1 > 0) ::kill(r1, SIGKILL);
  ASSERT_GT(r1, 0) << "rank 1's process not found under mpirun " << pid;
  const std::string out = slurp(tmp / "out.txt");
  EXPECT_TRUE(ended) << "hang: still running after " << waited << " s: " << out;
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  EXPECT_NE(out.find("did not complete within 2 s (KVS_COLLECTIVE_TIMEOUT_S): rank 1 did not answer"),
            std::string::npos)
      << out;
}
