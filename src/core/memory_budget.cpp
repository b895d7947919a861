#include "core/memory_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kvs {

namespace {

std::string read_small(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  if (in) s << in.rdbuf();
  return s.str();
}

// The value of "key:   123 kB" lines, in bytes.
std::optional<uint64_t> kib_field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream v(line.substr(key.size() + 1));
    uint64_t kib = 0;
    if (v >> kib) return kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> number(const std::string& text) {
  std::istringstream in(text);
  uint64_t n = 0;
  if (in >> n) return n;
  return std::nullopt;  // "max", or nothing
}

// "name value" lines (memory.stat), the value of `key`.
std::optional<uint64_t> stat_field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string name;
    uint64_t v = 0;
    if (in >> name >> v && name == key) return v;
  }
  return std::nullopt;
}

// This process's memory cgroup: limit, usage and memory.stat, from cgroup v2
// (memory.max, memory.current) or v1's memory controller (limit_in_bytes,
// usage_in_bytes); empty strings where there is none.
struct CgroupMemoryFiles {
  std::string max, current, stat;
};
CgroupMemoryFiles cgroup_memory_files() {
  std::istringstream lines(read_small("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string path = line.substr(b + 1);
    std::istringstream controllers(line.substr(a + 1, b - a - 1));
    bool memory = false;
    for (std::string c; std::getline(controllers, c, ',');) memory = memory || c == "memory";
    if (memory) {
      const std::string dir = "/sys/fs/cgroup/memory" + path;
      return {read_small(dir + "/memory.limit_in_bytes"), read_small(dir + "/memory.usage_in_bytes"),
              read_small(dir + "/memory.stat")};
    }
    if (line.rfind("0::", 0) == 0) {
      const std::string dir = "/sys/fs/cgroup" + path;
      CgroupMemoryFiles f{read_small(dir + "/memory.max"), read_small(dir + "/memory.current"),
                          read_small(dir + "/memory.stat")};
      if (!f.max.empty()) return f;  // else a v1 memory line may follow
    }
  }
  return {};
}

double gib(uint64_t b) { return static_cast<double>(b) / (1u << 30); }

}  // namespace

std::optional<uint64_t> memory_available_bytes(const std::string& meminfo, const std::string& cgroup_max,
                                               const std::string& cgroup_current, const std::string& cgroup_stat) {
  std::optional<uint64_t> best = kib_field(meminfo, "MemAvailable");
  const std::optional<uint64_t> max = number(cgroup_max), current = number(cgroup_current);
  // v1 writes "no limit" as a number near 2^63.
  if (max && current && *max < (uint64_t{1} << 60)) {
    // The page cache the cgroup holds is reclaimed before the kernel kills:
    // its inactive part counts as free (as Kubernetes' working set does).
    const uint64_t cache = stat_field(cgroup_stat, "inactive_file").value_or(0) +
                           stat_field(cgroup_stat, "total_inactive_file").value_or(0);
    const uint64_t used = *current > cache ? *current - cache : 0;
    const uint64_t left = *max > used ? *max - used : 0;
    best = best ? std::min(*best, left) : left;
  }
  return best;
}

std::optional<uint64_t> memory_available_bytes() {
  const CgroupMemoryFiles f = cgroup_memory_files();
  return memory_available_bytes(read_small("/proc/meminfo"), f.max, f.current, f.stat);
}

ProcessMemory process_memory() {
  const std::string status = read_small("/proc/self/status");
  return {kib_field(status, "VmData").value_or(0), kib_field(status, "RssAnon").value_or(0)};
}

std::string memory_shortfall(uint64_t untouched, int local_ranks, std::optional<uint64_t> available) {
  local_ranks = std::max(1, local_ranks);
  const double needed = static_cast<double>(untouched) * local_ranks;
  if (!available || needed <= static_cast<double>(*available)) return "";
  return fmt::format(
      "the buffers allocated for this run will take {:.3g} GiB more when its first step writes them{}, but this "
      "machine has {:.3g} GiB available (MemAvailable, or what its cgroup's memory limit leaves): the kernel may kill "
      "the run without a message; lower train.micro_batch_size or train.seq_len, or spread the model "
      "over more processes or machines",
      gib(untouched) * local_ranks,
      local_ranks > 1 ? fmt::format(" ({:.3g} GiB in each of this node's {} processes)", gib(untouched), local_ranks)
                      : "",
      gib(*available));
}

}  // namespace kvs
