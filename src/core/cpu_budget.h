// How many threads "all cores" means for this process: the CPUs its affinity
// mask allows (taskset, mpirun --bind-to, a batch system's cpuset), capped by
// a cgroup CPU quota (docker --cpus, a Kubernetes CPU limit), which the mask
// does not show. A container limited to 2 CPUs on a 64-core host would
// otherwise run 64 OpenMP threads that the kernel throttles in bursts, and an
// OpenMP team waits at every barrier for its slowest thread (8 threads on 2
// cores: 1.6x slower steps, measured on the development VM without a quota).
#pragma once
#include <optional>
#include <string>

namespace kvs {

// The CPU quota in CPUs (quota / period, the smallest along the cgroup's path
// from its own directory up to the hierarchy's root), or nullopt where none is
// set. proc_cgroup is the text of /proc/self/cgroup; cgroup_root is where the
// hierarchies are mounted (/sys/fs/cgroup; tests pass a directory of their
// own). cgroup v2 (a "0::path" line, cpu.max) and v1 (a line whose
// controllers include "cpu", cpu.cfs_quota_us / cpu.cfs_period_us under the
// "cpu" or "cpu,cpuacct" mount) are both read.
std::optional<double> cgroup_cpu_quota(const std::string& proc_cgroup, const std::string& cgroup_root);

struct CpuBudget {
  int threads;                  // what "all cores" (threads = 0) means: >= 1
  int affinity_cpus;            // omp_get_num_procs(): the CPUs of the affinity mask
  std::optional<double> quota;  // the cgroup CPU quota, if one is set
  int local_ranks = 1;          // processes the launcher started on this node (they share its CPUs)
  int online_cpus = 0;          // the node's CPUs (0: not known)
  // "" when the mask decides; else one line on the quota that caps it.
  std::string note() const;
  // "" unless `requested` threads are more than the budget; else a one-line
  // warning (the threads take turns on the cores and wait for each other at
  // every OpenMP barrier).
  std::string oversubscribed(int requested) const;
};

// affinity_cpus capped by ceil(quota) (at least 1). With local_ranks > 1
// processes on a node of online_cpus CPUs (mpirun --bind-to none, torchrun:
// every rank's mask holds the whole node), each takes its share: at most
// online_cpus / local_ranks threads, and ceil(quota / local_ranks) of a quota
// the node's container sets for all of them. A rank bound to fewer CPUs keeps
// its mask's count.
CpuBudget cpu_budget(int affinity_cpus, std::optional<double> quota, int local_ranks = 1, int online_cpus = 0);
// This process's budget (read once, then cached).
const CpuBudget& process_cpu_budget();
// requested > 0: requested; 0: process_cpu_budget().threads.
int resolve_threads(int requested);
// Runs the CPU kernels (OpenMP and OpenBLAS) on resolve_threads(requested)
// threads (train.threads, a command's --threads); returns the count.
int use_threads(int requested);
// "1 thread", "2 threads": for messages.
std::string thread_count(int n);
// Called once in main: where a quota caps the budget and the user did not set
// OMP_NUM_THREADS, the default thread count of OpenMP and OpenBLAS becomes the
// budget, for the commands that do not set their own (eval, forward, ...).
void default_threads_to_cpu_budget();

}  // namespace kvs
