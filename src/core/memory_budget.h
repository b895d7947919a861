// How much memory this process may still take, and how much of what it has
// reserved it has not touched yet: with Linux's overcommit an allocation
// succeeds and the process is killed (SIGKILL, no message) when it first
// writes pages the machine does not have. The trainer compares the two once
// its buffers are allocated and warns before the first step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace kvs {

// The smaller of the machine's MemAvailable (/proc/meminfo) and, in a memory
// cgroup with a limit (v2 memory.max, v1 memory.limit_in_bytes), what is left
// under it, its inactive page cache counted as free; nullopt if neither is known.
std::optional<uint64_t> memory_available_bytes();
// The same from the given file contents (tests): meminfo; the cgroup's limit,
// usage and memory.stat ("" when absent).
std::optional<uint64_t> memory_available_bytes(const std::string& meminfo, const std::string& cgroup_max,
                                               const std::string& cgroup_current, const std::string& cgroup_stat = "");

// This process's private writable memory, reserved (VmData) and resident
// (RssAnon), from /proc/self/status; 0 where it cannot be read.
struct ProcessMemory {
  uint64_t reserved = 0, resident = 0;
};
ProcessMemory process_memory();

// One line when `untouched` bytes a process will still write, times the
// `local_ranks` processes of this node that each do so, exceed `available`;
// "" otherwise (or when available is unknown).
std::string memory_shortfall(uint64_t untouched, int local_ranks, std::optional<uint64_t> available);

}  // namespace kvs
