// The CPU time a hypervisor took from this VM (Linux /proc/stat, the "steal"
// column: time a vCPU was ready to run while the host ran something else).
// `kvshift bench` reads it around its timed steps: on a shared VM a few percent
// of steal slow a run by about that much or more (a multi-threaded step waits
// for its slowest thread), which says a result is the neighbours', not the
// code's. Frequency changes on the host do not show here.
#pragma once
#include <optional>
#include <string>

namespace kvs {

struct CpuTimes {
  unsigned long long total = 0;  // every state's time, all CPUs (USER_HZ ticks)
  unsigned long long steal = 0;
};

// The aggregate "cpu" line of a /proc/stat-format text (user nice system idle
// iowait irq softirq steal [guest guest_nice]; guest time is already in user
// and nice); nullopt without one. Kernels before 2.6.11 have no steal column: 0.
std::optional<CpuTimes> parse_cpu_times(const std::string& proc_stat);
// /proc/stat now (nullopt where it cannot be read: not Linux, no procfs).
std::optional<CpuTimes> read_cpu_times();
// Steal over [a, b] as a fraction of all CPU time in it; 0 when no time passed.
double steal_fraction(const CpuTimes& a, const CpuTimes& b);

}  // namespace kvs
