// detect_launch(): the launcher's environment variables, parsed strictly.
#include "dist/launch.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace kvs::dist {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// The whole value must be a decimal int: "2x", "" and "1e3" are errors.
int parse_int(const char* name, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  KVS_CHECK(!v.empty() && end && *end == '\0' && errno == 0 && x >= INT_MIN && x <= INT_MAX,
            "{}='{}' is not an integer", name, v);
  return static_cast<int>(x);
}

std::optional<int> env_int(const char* name) {
  const auto v = env(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

int require_int(const char* name, const char* launcher, const char* set_by) {
  const auto v = env_int(name);
  KVS_CHECK(v.has_value(), "{} is not set, but {} variables are ({} sets {})", name, launcher, launcher, set_by);
  return *v;
}

void validate(const LaunchInfo& l, const char* rank_var, const char* size_var, const char* local_var,
              const char* local_size_var) {
  KVS_CHECK(l.world_size >= 1, "{}={} must be at least 1", size_var, l.world_size);
  KVS_CHECK(l.rank >= 0 && l.rank < l.world_size, "{}={} is outside 0..{} ({}={})", rank_var, l.rank,
            l.world_size - 1, size_var, l.world_size);
  KVS_CHECK(l.local_world_size >= 1 && l.local_world_size <= l.world_size, "{}={} must be in 1..{} ({}={})",
            local_size_var, l.local_world_size, l.world_size, size_var, l.world_size);
  KVS_CHECK(l.local_rank >= 0 && l.local_rank < l.local_world_size, "{}={} is outside 0..{} ({}={})", local_var,
            l.local_rank, l.local_world_size - 1, local_size_var, l.local_world_size);
}

// MASTER_ADDR / MASTER_PORT when present (under mpirun they are optional).
void read_master(LaunchInfo& l, bool required) {
  const auto addr = env("MASTER_ADDR");
  const auto port = env_int("MASTER_PORT");
  if (required) {
    KVS_CHECK(addr.has_value(), "MASTER_ADDR is not set, but torchrun variables are (WORLD_SIZE={})", l.world_size);
    KVS_CHECK(port.has_value(), "MASTER_PORT is not set, but torchrun variables are (WORLD_SIZE={})", l.world_size);
  }
  if (addr) {
    KVS_CHECK(!addr->empty(), "MASTER_ADDR is empty");
    l.master_addr = *addr;
  }
  if (port) {
    KVS_CHECK(*port >= 1 && *port <= 65535, "MASTER_PORT={} is outside 1..65535", *port);
    l.master_port = *port;
  }
}

const char* kTorchVars = "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT";
const char* kOmpiVars = "OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE";

LaunchInfo from_torchrun() {
  LaunchInfo l;
  l.launcher = "torchrun";
  l.rank = require_int("RANK", "torchrun", kTorchVars);
  l.world_size = require_int("WORLD_SIZE", "torchrun", kTorchVars);
  l.local_rank = require_int("LOCAL_RANK", "torchrun", kTorchVars);
  l.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(l.world_size);
  validate(l, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  read_master(l, l.world_size > 1);
  return l;
}

LaunchInfo from_mpirun() {
  LaunchInfo l;
  l.launcher = "mpirun";
  l.rank = require_int("OMPI_COMM_WORLD_RANK", "mpirun", kOmpiVars);
  l.world_size = require_int("OMPI_COMM_WORLD_SIZE", "mpirun", kOmpiVars);
  l.local_rank = require_int("OMPI_COMM_WORLD_LOCAL_RANK", "mpirun", kOmpiVars);
  l.local_world_size = require_int("OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun", kOmpiVars);
  validate(l, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
           "OMPI_COMM_WORLD_LOCAL_SIZE");
  read_master(l, false);
  return l;
}

// torchrun's variables beside mpirun's (e.g. torchrun inside an mpirun job, or
// a stale export) are accepted only when they say the same thing.
void check_agree(const LaunchInfo& m) {
  const std::pair<const char*, int> pairs[] = {{"RANK", m.rank}, {"WORLD_SIZE", m.world_size},
                                               {"LOCAL_RANK", m.local_rank}};
  const char* ompi[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"};
  for (int i = 0; i < 3; ++i) {
    const auto v = env_int(pairs[i].first);
    KVS_CHECK(!v || *v == pairs[i].second,
              "both mpirun and torchrun variables are set and disagree: {}={} but {}={}", ompi[i], pairs[i].second,
              pairs[i].first, *v);
  }
}

// Launchers whose variables kvshift does not read: srun, MPICH's and Intel
// MPI's mpiexec (PMI), MVAPICH2. Taken for a single process, each of their
// processes would train alone into the same run directory, so a world of more
// than one process there is an error. (A non-integer value is not ours to judge.)
struct UnreadWorld {
  const char* size_var = nullptr;  // null: none of them says more than one process
  const char* rank_var = nullptr;
  std::string size_text;
  long size = 1;
};

UnreadWorld unread_world() {
  const std::pair<const char*, const char*> vars[] = {
      {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"}, {"PMI_SIZE", "PMI_RANK"}, {"MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"}};
  for (const auto& [size_var, rank_var] : vars) {
    const auto x = env(size_var);
    if (!x) continue;
    char* end = nullptr;
    const long n = std::strtol(x->c_str(), &end, 10);
    if (end != x->c_str() && *end == '\0' && n > 1) return {size_var, rank_var, *x, n};
  }
  return {};
}

void refuse_unread_launchers() {
  const UnreadWorld w = unread_world();
  KVS_CHECK(!w.size_var,
            "{}={}: started by a launcher kvshift does not read (srun, or an MPI other than OpenMPI); each "
            "process would train alone into the same run directory. Start it with OpenMPI's mpirun or "
            "torchrun --no-python (docs/LAUNCH.md)",
            w.size_var ? w.size_var : "", w.size_text);
}

}  // namespace

LaunchInfo unread_launcher_world() {
  const UnreadWorld w = unread_world();
  LaunchInfo l;
  if (!w.size_var) return l;
  const auto r = env(w.rank_var);
  l.world_size = static_cast<int>(std::min<long>(w.size, INT_MAX));
  l.rank = r ? static_cast<int>(std::strtol(r->c_str(), nullptr, 10)) : 0;
  l.launcher = std::string(w.size_var) == "SLURM_STEP_NUM_TASKS" ? "srun" : "an MPI launcher";
  return l;
}

LaunchInfo detect_launch() {
  const bool ompi = env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE");
  const bool torch = env("RANK") || env("WORLD_SIZE") || env("LOCAL_RANK");
  if (ompi) {
    LaunchInfo l = from_mpirun();
    if (torch) check_agree(l);
    return l;
  }
  if (torch) return from_torchrun();
  refuse_unread_launchers();
  return LaunchInfo{};
}

std::string describe(const LaunchInfo& l) {
  return fmt::format("rank {}/{} local {}/{} launcher {}", l.rank, l.world_size, l.local_rank, l.local_world_size,
                     l.launcher);
}

}  // namespace kvs::dist
