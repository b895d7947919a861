// Launch detection (mpirun / torchrun / single environments, and every bad
// environment), bootstrap options, and the bootstrap end to end: W kvshift
// dist-check processes started torchrun-style on 127.0.0.1, including a
// missing rank and a lone rank, which must fail fast with a clear message.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "build_paths.h"
#include "dist/bootstrap.h"
#include "dist/launch.h"
#include "test_util.h"

namespace {

using kvs::dist::bootstrap_exchange;
using kvs::dist::BootstrapOptions;
using kvs::dist::LaunchInfo;
using kvs::dist::bootstrap_options;
using kvs::dist::detect_launch;
using kvs::testing_util::CommandResult;

const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE", "KVS_BOOTSTRAP_PORT", "KVS_BOOTSTRAP_TIMEOUT_S",
                       "SLURM_STEP_NUM_TASKS", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};

// Clears the launch variables for one test and restores them after it.
class CleanEnv {
 public:
  CleanEnv() {
    for (const char* v : kVars) {
      if (const char* x = std::getenv(v)) saved_[v] = x;
      ::unsetenv(v);
    }
  }
  ~CleanEnv() {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  void set(const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); }
  void torchrun(int rank, int world, int local) {
    set("RANK", std::to_string(rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_RANK", std::to_string(local));
    set("LOCAL_WORLD_SIZE", std::to_string(world));
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", "29500");
  }
  void mpirun(int rank, int world, int local, int local_size) {
    set("OMPI_COMM_WORLD_RANK", std::to_string(rank));
    set("OMPI_COMM_WORLD_SIZE", std::to_string(world));
    set("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local));
    set("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size));
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST(Launch, SingleWithoutLauncherVariables) {
  CleanEnv env;
  const auto l = detect_launch();
  EXPECT_EQ(l.launcher, "single");
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.world_size, 1);
  EXPECT_EQ(l.local_rank, 0);
  EXPECT_EQ(l.local_world_size, 1);
}

// srun, MPICH/Intel MPI (PMI) and MVAPICH2 start processes whose variables
// kvshift does not read: more than one of them is refused (each would train
// alone), one is a single process, and mpirun's or torchrun's variables win.
TEST(Launch, OtherLaunchersWithMoreThanOneProcessAreRefused) {
  for (const char* var : {"SLURM_STEP_NUM_TASKS", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    SCOPED_TRACE(var);
    {
      CleanEnv env;
      env.set(var, "4");
      EXPECT_KVS_ERROR(detect_launch(), std::string(var) + "=4: started by a launcher kvshift does not read",
                       "mpirun", "torchrun");
    }
    {
      CleanEnv env;
      env.set(var, "1");
      EXPECT_EQ(detect_launch().launcher, "single");
    }
    {
      CleanEnv env;
      env.set(var, "4");
      env.mpirun(1, 4, 1, 4);
      EXPECT_EQ(detect_launch().launcher, "mpirun");
    }
    {
      CleanEnv env;
      env.set(var, "4");
      env.torchrun(1, 4, 1);
      EXPECT_EQ(detect_launch().launcher, "torchrun");
    }
  }
}

TEST(Launch, Torchrun) {
  CleanEnv env;
  env.torchrun(3, 8, 1);
  env.set("LOCAL_WORLD_SIZE", "4");
  const auto l = detect_launch();
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world_size, 4);
  EXPECT_EQ(l.master_addr, "127.0.0.1");
  EXPECT_EQ(l.master_port, 29500);
  EXPECT_EQ(kvs::dist::describe(l), "rank 3/8 local 1/4 launcher torchrun");
}

TEST(Launch, TorchrunWorldOfOneNeedsNoMaster) {
  CleanEnv env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  env.set("LOCAL_RANK", "0");
  const auto l = detect_launch();
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_EQ(l.local_world_size, 1);
}

TEST(Launch, Mpirun) {
  CleanEnv env;
  env.mpirun(5, 8, 1, 4);
  const auto l = detect_launch();
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_world_size, 4);
  EXPECT_EQ(l.master_addr, "");
  EXPECT_EQ(l.master_port, 0);
}

TEST(Launch, MpirunWithAgreeingTorchrunVariables) {
  CleanEnv env;
  env.torchrun(1, 2, 1);
  env.mpirun(1, 2, 1, 2);
  const auto l = detect_launch();
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.master_addr, "127.0.0.1");
  EXPECT_EQ(l.master_port, 29500);
}

TEST(Launch, BadEnvironments) {
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    env.set("RANK", "one");
    EXPECT_KVS_ERROR(detect_launch(), "RANK='one' is not an integer");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    env.set("WORLD_SIZE", "2x");
    EXPECT_KVS_ERROR(detect_launch(), "WORLD_SIZE='2x' is not an integer");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    env.set("LOCAL_RANK", "");
    EXPECT_KVS_ERROR(detect_launch(), "LOCAL_RANK='' is not an integer");
  }
  {
    CleanEnv env;
    env.torchrun(2, 2, 0);
    EXPECT_KVS_ERROR(detect_launch(), "RANK=2", "outside 0..1", "WORLD_SIZE=2");
  }
  {
    CleanEnv env;
    env.torchrun(-1, 2, 0);
    EXPECT_KVS_ERROR(detect_launch(), "RANK=-1", "outside 0..1");
  }
  {
    CleanEnv env;
    env.torchrun(0, 0, 0);
    EXPECT_KVS_ERROR(detect_launch(), "WORLD_SIZE=0 must be at least 1");
  }
  {
    CleanEnv env;
    env.torchrun(1, 4, 2);
    env.set("LOCAL_WORLD_SIZE", "2");
    EXPECT_KVS_ERROR(detect_launch(), "LOCAL_RANK=2", "outside 0..1", "LOCAL_WORLD_SIZE=2");
  }
  {
    CleanEnv env;
    env.torchrun(1, 4, 0);
    env.set("LOCAL_WORLD_SIZE", "8");
    EXPECT_KVS_ERROR(detect_launch(), "LOCAL_WORLD_SIZE=8 must be in 1..4");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    ::unsetenv("WORLD_SIZE");
    EXPECT_KVS_ERROR(detect_launch(), "WORLD_SIZE is not set", "torchrun");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    ::unsetenv("LOCAL_RANK");
    EXPECT_KVS_ERROR(detect_launch(), "LOCAL_RANK is not set");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    ::unsetenv("MASTER_ADDR");
    EXPECT_KVS_ERROR(detect_launch(), "MASTER_ADDR is not set");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    ::unsetenv("MASTER_PORT");
    EXPECT_KVS_ERROR(detect_launch(), "MASTER_PORT is not set");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    env.set("MASTER_PORT", "70000");
    EXPECT_KVS_ERROR(detect_launch(), "MASTER_PORT=70000 is outside 1..65535");
  }
  {
    CleanEnv env;
    env.torchrun(0, 2, 0);
    env.set("MASTER_ADDR", "");
    EXPECT_KVS_ERROR(detect_launch(), "MASTER_ADDR is empty");
  }
  {
    CleanEnv env;
    env.mpirun(0, 2, 0, 2);
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    EXPECT_KVS_ERROR(detect_launch(), "OMPI_COMM_WORLD_LOCAL_RANK is not set", "mpirun");
  }
  {
    CleanEnv env;
    env.mpirun(4, 4, 0, 1);
    EXPECT_KVS_ERROR(detect_launch(), "OMPI_COMM_WORLD_RANK=4", "outside 0..3");
  }
  {
    CleanEnv env;
    env.mpirun(1, 2, 1, 2);
    env.torchrun(0, 2, 0);
    EXPECT_KVS_ERROR(detect_launch(), "both mpirun and torchrun", "disagree", "OMPI_COMM_WORLD_RANK=1", "RANK=0");
  }
}

TEST(Bootstrap, Options) {
  {
    CleanEnv env;
    env.torchrun(1, 2, 1);
    const auto o = bootstrap_options(detect_launch());
    EXPECT_EQ(o.addr, "127.0.0.1");
    EXPECT_EQ(o.port, 29501);  // torchrun's agent owns MASTER_PORT
    EXPECT_EQ(o.timeout_s, 120);
  }
  {
    CleanEnv env;
    env.torchrun(1, 2, 1);
    env.set("KVS_BOOTSTRAP_PORT", "31000");
    env.set("KVS_BOOTSTRAP_TIMEOUT_S", "2.5");
    const auto o = bootstrap_options(detect_launch());
    EXPECT_EQ(o.port, 31000);
    EXPECT_EQ(o.timeout_s, 2.5);
  }
  {
    CleanEnv env;
    env.torchrun(1, 2, 1);
    env.set("KVS_BOOTSTRAP_TIMEOUT_S", "soon");
    EXPECT_KVS_ERROR(bootstrap_options(detect_launch()), "KVS_BOOTSTRAP_TIMEOUT_S='soon'");
  }
  {
    CleanEnv env;
    env.torchrun(1, 2, 1);
    env.set("KVS_BOOTSTRAP_PORT", "0");
    EXPECT_KVS_ERROR(bootstrap_options(detect_launch()), "KVS_BOOTSTRAP_PORT='0'");
  }
  {
    CleanEnv env;
    env.torchrun(1, 2, 1);
    env.set("MASTER_PORT", "65535");
    EXPECT_KVS_ERROR(bootstrap_options(detect_launch()), "MASTER_PORT=65535", "KVS_BOOTSTRAP_PORT");
  }
  {
    CleanEnv env;  // under mpirun the bootstrap needs MASTER_ADDR given with -x
    env.mpirun(1, 2, 1, 2);
    EXPECT_KVS_ERROR(bootstrap_options(detect_launch()), "rank 1", "MASTER_ADDR", "mpirun");
  }
}

// ---- end to end: kvshift dist-check processes ----

// A port nobody listens on now (the kernel's pick for port 0).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(s);
  return ntohs(a.sin_port);
}

// One rank of a torchrun-style launch whose bootstrap port is `port`.
FILE* start_rank(int rank, int world, int port, const std::string& extra = "") {
  const std::string cmd = "env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u KVS_BOOTSTRAP_PORT RANK=" +
                          std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
                          " LOCAL_RANK=" + std::to_string(rank) + " LOCAL_WORLD_SIZE=" + std::to_string(world) +
                          " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port - 1) + " " + extra + " " +
                          kvs::test::cli_binary() + " dist-check 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  return p;
}

CommandResult finish(FILE* p) {
  CommandResult r{0, ""};
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void expect_all_join(int world) {
  const int port = free_port();
  std::vector<FILE*> procs;
  for (int r = world - 1; r >= 0; --r) procs.push_back(start_rank(r, world, port));  // rank 0 last: peers retry
  for (int i = 0; i < world; ++i) {
    const int r = world - 1 - i;
    const CommandResult res = finish(procs[i]);
    EXPECT_EQ(res.code, 0) << res.out;
    EXPECT_NE(res.out.find("rank " + std::to_string(r) + "/" + std::to_string(world) + " local " + std::to_string(r) +
                           " launcher torchrun: joined"),
              std::string::npos)
        << res.out;
    if (r == 0) {
      EXPECT_NE(res.out.find("all " + std::to_string(world) + " ranks joined"), std::string::npos) << res.out;
    }
  }
}

// The blob itself, in one process (a thread per rank): every rank gets rank 0's bytes, all 128
// of them, NULs included, as in an NCCL unique id. dist-check's blob is text and is the same on
// every rank, so the runs above could not tell.
TEST(Bootstrap, EveryRankGetsRankZerosBytes) {
  const int world = 3, port = free_port();
  std::string id(128, '\0');
  for (int i = 1; i < 128; ++i) id[i] = static_cast<char>(i == 64 ? 0 : (i * 37) % 256);
  std::vector<std::string> got(world), errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      LaunchInfo info;
      info.rank = info.local_rank = r;
      info.world_size = info.local_world_size = world;
      info.launcher = "torchrun";
      info.master_addr = "127.0.0.1";
      info.master_port = port - 1;
      BootstrapOptions opt;
      opt.addr = "127.0.0.1";
      opt.port = port;
      opt.timeout_s = 30;
      try {
        got[r] = bootstrap_exchange(info, opt, r == 0 ? id : "rank " + std::to_string(r) + "'s own blob");
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], id) << "rank " << r;
  }
}

TEST(Bootstrap, TwoRanksJoin) { expect_all_join(2); }
TEST(Bootstrap, FourRanksJoin) { expect_all_join(4); }

TEST(Bootstrap, MissingRankIsNamed) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<FILE*> procs;
  for (int r = 0; r < 3; ++r) procs.push_back(start_rank(r, 4, port, "KVS_BOOTSTRAP_TIMEOUT_S=2"));
  const CommandResult root = finish(procs[0]);
  EXPECT_LT(seconds_since(t0), 15);
  EXPECT_EQ(root.code, 1) << root.out;
  EXPECT_NE(root.out.find("rank 0: rank(s) 3 of 4 did not join the bootstrap at 127.0.0.1:" + std::to_string(port) +
                          " within 2 s"),
            std::string::npos)
      << root.out;
  for (int r = 1; r < 3; ++r) {  // the others learn why from rank 0
    const CommandResult res = finish(procs[r]);
    EXPECT_EQ(res.code, 1) << res.out;
    EXPECT_NE(res.out.find("rank " + std::to_string(r) + ": the bootstrap failed on rank 0: rank(s) 3 of 4"),
              std::string::npos)
        << res.out;
  }
  EXPECT_LT(seconds_since(t0), 20);
}

TEST(Bootstrap, LoneRankTimesOut) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const CommandResult res = finish(start_rank(1, 2, port, "KVS_BOOTSTRAP_TIMEOUT_S=2"));
  EXPECT_LT(seconds_since(t0), 15);
  EXPECT_EQ(res.code, 1) << res.out;
  EXPECT_NE(res.out.find("kvshift: error: rank 1: no answer from rank 0 at 127.0.0.1:" + std::to_string(port) +
                         " after 2 s"),
            std::string::npos)
      << res.out;
}

TEST(Bootstrap, WorldSizeMismatchIsNamed) {
  const int port = free_port();
  FILE* peer = start_rank(1, 3, port, "KVS_BOOTSTRAP_TIMEOUT_S=10");
  FILE* root = start_rank(0, 2, port, "KVS_BOOTSTRAP_TIMEOUT_S=10");
  const CommandResult r0 = finish(root), r1 = finish(peer);
  EXPECT_EQ(r0.code, 1) << r0.out;
  EXPECT_NE(r0.out.find("rank 0: rank 1 has world size 3, rank 0 has 2"), std::string::npos) << r0.out;
  EXPECT_EQ(r1.code, 1) << r1.out;
  EXPECT_NE(r1.out.find("rank 1: the bootstrap failed on rank 0: rank 1 has world size 3"), std::string::npos)
      << r1.out;
}

TEST(Bootstrap, DuplicateRankIsNamed) {
  const int port = free_port();
  FILE* a = start_rank(1, 3, port, "KVS_BOOTSTRAP_TIMEOUT_S=10");
  FILE* b = start_rank(1, 3, port, "KVS_BOOTSTRAP_TIMEOUT_S=10");
  FILE* root = start_rank(0, 3, port, "KVS_BOOTSTRAP_TIMEOUT_S=10");
  const CommandResult r0 = finish(root);
  finish(a);
  finish(b);
  EXPECT_EQ(r0.code, 1) << r0.out;
  EXPECT_NE(r0.out.find("rank 0: rank 1 joined twice"), std::string::npos) << r0.out;
}

TEST(Bootstrap, BusyPortIsReported) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const CommandResult r = finish(start_rank(0, 2, port, "KVS_BOOTSTRAP_TIMEOUT_S=2"));
  ::close(s);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("rank 0: cannot listen on port " + std::to_string(port) + " for the bootstrap"),
            std::string::npos)
      << r.out;
}

TEST(Bootstrap, BadEnvironmentFailsAtOnce) {
  const auto r = kvs::testing_util::run_kvshift("dist-check", "env RANK=x WORLD_SIZE=2 LOCAL_RANK=0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kvshift: error: RANK='x' is not an integer"), std::string::npos) << r.out;
}

TEST(Bootstrap, SingleProcessNeedsNoBootstrap) {
  const auto r = kvs::testing_util::run_kvshift(
      "dist-check", "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0/1 local 0 launcher single: joined"), std::string::npos) << r.out;
}

}  // namespace
