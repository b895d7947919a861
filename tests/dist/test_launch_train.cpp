// `kvshift train` under torchrun-style variables (docs/LAUNCH.md): the world
// backend chosen for each launcher and device, a CPU run on 2 torchrun ranks
// failing at once on both with the mpirun hint (no hang, nothing written), and
// a torchrun world of one training as a single process. The bootstrap itself
// (joins, a missing rank) is tested with dist-check in test_launch.cpp.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "build_paths.h"
#include "data/shards.h"
#include "dist/world.h"
#include "test_util.h"

namespace {

using kvs::dist::LaunchInfo;
using kvs::dist::world_backend;
using kvs::testing_util::CommandResult;
using kvs::testing_util::TmpDir;

LaunchInfo launch(const std::string& launcher, int rank, int world) {
  LaunchInfo l;
  l.launcher = launcher;
  l.rank = rank;
  l.world_size = world;
  l.local_rank = rank;
  l.local_world_size = world;
  return l;
}

// A tiny model whose head_dim (16) the CUDA engine accepts too.
std::string tiny_config(const std::string& device) {
  return R"({"name": "torchrun", "device": ")" + device + R"(",
    "model": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 16,
              "kv_shift": {"enabled": true}},
    "data": {"type": "induction", "induction": {"token_lo": 2, "token_hi": 32, "pool_size": 8}},
    "train": {"seq_len": 16, "micro_batch_size": 2, "grad_accum_steps": 2, "steps": 3, "warmup_steps": 1,
              "eval_every": 3, "eval_sequences": 4, "checkpoint_every": 3, "threads": 1}})";
}

// torchrun's variables for one rank; `timeout` ends a hang as a failed test.
std::string torchrun_env(int rank, int world) {
  return "env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK -u KVS_BOOTSTRAP_PORT "
         "KVS_BOOTSTRAP_TIMEOUT_S=5 RANK=" +
         std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) + " LOCAL_RANK=" + std::to_string(rank) +
         " LOCAL_WORLD_SIZE=" + std::to_string(world) +
         (world > 1 ? " MASTER_ADDR=127.0.0.1 MASTER_PORT=29400" : "") + " timeout 60 ";
}

// mpirun as root on a 2-core CI machine (its opt-in, --oversubscribe, shared
// memory without CMA); `timeout` ends a hang as a failed test.
constexpr const char* kMpirun =
    "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
    "timeout 60 mpirun --oversubscribe --bind-to none ";

CommandResult finish(FILE* p) {
  CommandResult r{0, ""};
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(LaunchWorld, BackendForEachLauncherAndDevice) {
  for (kvs::Device dev : {kvs::Device::Cpu, kvs::Device::Cuda}) {
    EXPECT_EQ(world_backend(LaunchInfo{}, dev), "single");
    EXPECT_EQ(world_backend(launch("mpirun", 1, 4), dev), "mpi");
    EXPECT_EQ(world_backend(launch("torchrun", 0, 1), dev), "single");  // a torchrun world of one
  }
  EXPECT_EQ(world_backend(launch("torchrun", 1, 2), kvs::Device::Cuda), "nccl");
  EXPECT_KVS_ERROR(world_backend(launch("torchrun", 1, 4), kvs::Device::Cpu), "rank 1/4", "torchrun started 4 ranks",
                   "device \"cpu\"", "mpirun -np 4");
}

TEST(LaunchWorld, TorchrunCpuRunFailsOnEveryRankAtOnce) {
  TmpDir tmp;
  kvs::testing_util::spit(tmp / "c.json", tiny_config("cpu"));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<FILE*> procs;
  for (int r = 0; r < 2; ++r) {
    const std::string cmd = torchrun_env(r, 2) + kvs::test::cli_binary() + " train --quiet --config " +
                            (tmp / "c.json") + " --run-dir " + (tmp / "run") + " 2>&1";
    procs.push_back(::popen(cmd.c_str(), "r"));
    ASSERT_NE(procs.back(), nullptr);
  }
  for (int r = 0; r < 2; ++r) {
    const CommandResult res = finish(procs[r]);
    EXPECT_EQ(res.code, 1) << res.out;  // not 124 (timeout: a hang)
    EXPECT_NE(res.out.find("kvshift: error: rank " + std::to_string(r) +
                           "/2: torchrun started 2 ranks on device \"cpu\""),
              std::string::npos)
        << res.out;
    EXPECT_NE(res.out.find("mpirun -np 2 kvshift"), std::string::npos) << res.out;
  }
  // Detected from the environment alone: no bootstrap wait, no files written.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  EXPECT_FALSE(std::filesystem::exists(tmp / "run")) << "a failed launch wrote its run directory";
}

TEST(LaunchWorld, TorchrunWorldOfOneTrains) {
  TmpDir tmp;
  kvs::testing_util::spit(tmp / "c.json", tiny_config("cpu"));
  const auto r = kvs::testing_util::run_kvshift(
      "train --quiet --config " + (tmp / "c.json") + " --run-dir " + (tmp / "run"), torchrun_env(0, 1));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parallel layout: dp 1, tp 1, backend single"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 steps"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(tmp / "run/metrics.jsonl"));
}

#ifndef KVS_CUDA
// GPU runs under torchrun need NCCL: a CPU-only build says so on every rank.
TEST(LaunchWorld, TorchrunCudaNeedsACudaBuild) {
  TmpDir tmp;
  kvs::testing_util::spit(tmp / "c.json", tiny_config("cuda"));
  const auto r = kvs::testing_util::run_kvshift(
      "train --quiet --config " + (tmp / "c.json") + " --run-dir " + (tmp / "run"), torchrun_env(1, 2));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kvshift: error: rank 1: device \"cuda\" under torchrun needs NCCL"), std::string::npos)
      << r.out;
}
#endif

}  // namespace

// A subcommand that runs in one process (here info and export-hf), launched as
// two torchrun ranks or under mpirun: rank 0 says so in one line, every rank
// exits 1, and nothing is written; train, bench and eval are not refused.
TEST(LaunchWorld, OneProcessSubcommandsRefuseSeveralRanks) {
  TmpDir tmp;
  kvs::testing_util::spit(tmp / "c.json", tiny_config("cpu"));
  const std::string info = std::string(kvs::test::cli_binary()) + " info --config " + (tmp / "c.json") + " 2>&1";
  const std::string msg = "kvshift: error: info runs in one process, but torchrun started 2 ranks";
  for (int r = 0; r < 2; ++r) {
    const CommandResult res = finish(::popen((torchrun_env(r, 2) + info).c_str(), "r"));
    EXPECT_EQ(res.code, 1) << res.out;
    EXPECT_EQ(res.out.find(msg) != std::string::npos, r == 0) << "rank " << r << ": " << res.out;
    EXPECT_EQ(res.out.find("parameters"), std::string::npos) << "rank " << r << " ran info: " << res.out;
  }
  const CommandResult one = finish(::popen((torchrun_env(0, 1) + info).c_str(), "r"));
  EXPECT_EQ(one.code, 0) << one.out;  // a torchrun world of one is one process

  const std::string mpirun = std::string(kMpirun) + "-np 2 ";
  const CommandResult m = finish(::popen((mpirun + kvs::test::cli_binary() + " export-hf --checkpoint " +
                                          (tmp / "none") + " --out " + (tmp / "hf") + " 2>&1")
                                             .c_str(),
                                         "r"));
  EXPECT_NE(m.code, 0) << m.out;
  const std::string mpi_msg = "kvshift: error: export-hf runs in one process, but mpirun started 2 ranks";
  EXPECT_NE(m.out.find(mpi_msg), std::string::npos) << m.out;
  EXPECT_EQ(m.out.find(mpi_msg), m.out.rfind(mpi_msg)) << "reported more than once: " << m.out;
  EXPECT_FALSE(std::filesystem::exists(tmp / "hf"));

  // srun's tasks too (before, each task ran the whole command: two exports raced into one --out).
  const std::string srun_msg = "kvshift: error: info runs in one process, but srun started 2 ranks";
  for (int r = 0; r < 2; ++r) {
    const CommandResult res = finish(
        ::popen(("env SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=" + std::to_string(r) + " " + info).c_str(), "r"));
    EXPECT_EQ(res.code, 1) << res.out;
    EXPECT_EQ(res.out.find(srun_msg) != std::string::npos, r == 0) << "task " << r << ": " << res.out;
    EXPECT_EQ(res.out.find("parameters"), std::string::npos) << "task " << r << " ran info: " << res.out;
  }
  const CommandResult task = finish(::popen(("env SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 " + info).c_str(), "r"));
  EXPECT_EQ(task.code, 0) << task.out;  // srun -n 1
}

// A warning every rank would give alike (here the data's: a train glob over
// the validation shards) is said once for the job, by rank 0.
TEST(LaunchWorld, TheDatasWarningsArePrintedOncePerJob) {
  TmpDir tmp;
  std::vector<uint32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 2 + (i * 7) % 30;
  kvs::write_shard(tmp / "train_0.bin", tokens, 2);
  kvs::write_shard(tmp / "val_0.bin", tokens, 2);
  kvs::testing_util::spit(tmp / "manifest.json",
                          R"({"splits": {"train": {"shards": [{"file": "train_0.bin", "tokens": 3000}]},
                                         "val": {"shards": [{"file": "val_0.bin", "tokens": 3000}]}}})");
  std::string cfg = tiny_config("cpu");
  const std::string induction = R"({"type": "induction", "induction": {"token_lo": 2, "token_hi": 32, "pool_size": 8}})";
  cfg.replace(cfg.find(induction), induction.size(),
              R"({"type": "shards", "shards": {"train": [")" + (tmp / "*.bin") + R"("], "val": [")" +
                  (tmp / "val_*.bin") + R"("]}})");
  kvs::testing_util::spit(tmp / "c.json", cfg);
  const std::string mpirun = std::string(kMpirun) + "-np 2 ";
  const CommandResult r = finish(::popen((mpirun + kvs::test::cli_binary() + " train --quiet --config " +
                                          (tmp / "c.json") + " --run-dir " + (tmp / "run") + " 2>&1")
                                             .c_str(),
                                         "r"));
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string warning = "1 of its files is validation data";
  EXPECT_NE(r.out.find(warning), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(warning), r.out.rfind(warning)) << "said more than once: " << r.out;
}

// An error every rank hits (a config error, before any world exists) is
// printed once under mpirun, not once per rank: rank 0 prints at once, the
// others would only after kRepeatDelay, by when mpirun has stopped the job.
// An error one rank hits alone (here rank 1's KVS_CPU_GEMM, an MPMD launch)
// still reaches the terminal.
TEST(LaunchWorld, AnErrorEveryRankHitsIsPrintedOnce) {
  TmpDir tmp;
  kvs::testing_util::spit(tmp / "c.json", tiny_config("cpu"));
  const std::string mpirun = kMpirun;
  const std::string train = std::string(kvs::test::cli_binary()) + " train --config " + (tmp / "c.json") +
                            " --run-dir " + (tmp / "run") + " --set train.lr=-1";
  const CommandResult all = finish(::popen((mpirun + "-np 4 " + train + " 2>&1").c_str(), "r"));
  EXPECT_NE(all.code, 0) << all.out;
  const std::string msg = "kvshift: error: " + (tmp / "c.json") + ": train.lr: must be > 0, got -1";
  EXPECT_NE(all.out.find(msg), std::string::npos) << all.out;
  EXPECT_EQ(all.out.find(msg), all.out.rfind(msg)) << "reported more than once: " << all.out;

  const std::string ok = std::string(kvs::test::cli_binary()) + " train --config " + (tmp / "c.json") +
                         " --run-dir " + (tmp / "run");
  const CommandResult one =
      finish(::popen((mpirun + "-np 1 " + ok + " : -np 1 env KVS_CPU_GEMM=bogus " + ok + " 2>&1").c_str(), "r"));
  EXPECT_NE(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("kvshift: error: KVS_CPU_GEMM"), std::string::npos) << one.out;
}
