#include "core/cpu_budget.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

extern "C" void openblas_set_num_threads(int);

namespace kvs {

namespace fs = std::filesystem;

namespace {

std::string read_small(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return {};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The CPUs one cgroup directory's limit allows, if it sets one.
std::optional<double> v2_limit(const fs::path& dir) {
  std::istringstream in(read_small(dir / "cpu.max"));
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  try {
    const double q = std::stod(quota);
    return q > 0 ? std::optional<double>(q / period) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> v1_limit(const fs::path& dir) {
  double quota = 0, period = 0;
  std::istringstream q(read_small(dir / "cpu.cfs_quota_us")), p(read_small(dir / "cpu.cfs_period_us"));
  if (!(q >> quota) || !(p >> period) || quota <= 0 || period <= 0) return std::nullopt;  // -1: none
  return quota / period;
}

// The smallest limit from mount/path up to mount. A path that does not exist
// under the mount (a container that sees its own cgroup at the mount's root
// without a cgroup namespace) is read from the mount's root only.
template <class Limit>
std::optional<double> smallest_along(const fs::path& mount, const std::string& path, Limit limit) {
  fs::path rel = fs::path(path).relative_path().lexically_normal();
  std::error_code ec;
  if (!fs::is_directory(mount / rel, ec)) rel.clear();
  std::optional<double> best;
  for (fs::path r = rel;; r = r.parent_path()) {
    if (const auto l = limit(mount / r)) best = best ? std::min(*best, *l) : *l;
    if (r.empty() || r == r.parent_path()) break;
  }
  return best;
}

}  // namespace

std::optional<double> cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& cgroup_root) {
  const fs::path root(cgroup_root);
  std::istringstream lines(proc_cgroup);
  std::string line, v2_path;
  bool have_v2 = false;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      have_v2 = true;
      v2_path = path;
      continue;
    }
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c != "cpu") continue;
      // v1: the cpu controller's mount, named by its controllers.
      for (const fs::path& m : {root / controllers, root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"}) {
        std::error_code ec;
        if (fs::exists(m / "cpu.cfs_quota_us", ec)) return smallest_along(m, path, v1_limit);
      }
    }
  }
  if (!have_v2) return std::nullopt;
  std::error_code ec;
  // Hybrid systems mount the v2 hierarchy at root/unified.
  const fs::path mount = fs::exists(root / "cgroup.controllers", ec) ? root : root / "unified";
  return smallest_along(mount, v2_path, v2_limit);
}

CpuBudget cpu_budget(int affinity_cpus, std::optional<double> quota, int local_ranks, int online_cpus) {
  local_ranks = std::max(1, local_ranks);
  CpuBudget b{std::max(1, affinity_cpus), affinity_cpus, quota, local_ranks, online_cpus};
  if (quota) b.threads = std::clamp(static_cast<int>(std::ceil(*quota / local_ranks - 1e-9)), 1, b.threads);
  if (local_ranks > 1 && online_cpus > 0) b.threads = std::clamp(online_cpus / local_ranks, 1, b.threads);
  return b;
}

std::string CpuBudget::note() const {
  if (threads >= affinity_cpus) return {};
  if (local_ranks > 1 && (!quota || threads < static_cast<int>(std::ceil(*quota - 1e-9))))
    return fmt::format("{} threads: {} ranks share this node's {} CPUs, and this one may run on {} (set "
                       "train.threads to override)",
                       threads, local_ranks, online_cpus, affinity_cpus);
  return fmt::format("{} threads: the cgroup CPU quota of {:.2f} CPUs caps the {} CPUs this process may run on "
                     "(set train.threads to override)",
                     threads, *quota, affinity_cpus);
}

std::string CpuBudget::oversubscribed(int requested) const {
  if (requested <= threads) return {};
  const std::string why = quota && threads < affinity_cpus ? fmt::format(" (a cgroup CPU quota of {:.2f})", *quota) : "";
  return fmt::format("{} threads asked for, but this process may use {} CPUs{}: the threads take turns on the "
                     "cores and every parallel op waits for the last (8 threads on 2 cores: 1.6x slower steps); "
                     "train.threads = 0 picks {}",
                     requested, threads, why, threads);
}

// Processes the launcher started on this node (OpenMPI, torchrun, MPICH's hydra), 1 without one.
int launcher_local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(var); v && *v) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 1;
}

const CpuBudget& process_cpu_budget() {
  static const CpuBudget b =
      cpu_budget(omp_get_num_procs(), cgroup_cpu_quota(read_small("/proc/self/cgroup"), "/sys/fs/cgroup"),
                 launcher_local_ranks(), static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  return b;
}

int resolve_threads(int requested) { return requested > 0 ? requested : process_cpu_budget().threads; }

std::string thread_count(int n) { return std::to_string(n) + (n == 1 ? " thread" : " threads"); }

int use_threads(int requested) {
  const int n = resolve_threads(requested);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

void default_threads_to_cpu_budget() {
  const CpuBudget& b = process_cpu_budget();
  if (b.threads >= b.affinity_cpus || std::getenv("OMP_NUM_THREADS")) return;
  use_threads(b.threads);
}

}  // namespace kvs
