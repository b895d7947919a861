// What memory a process may still take (core/memory_budget.h): MemAvailable
// and a cgroup's memory.max, the smaller; and the warning a run that would not
// fit gets before its first step writes its buffers.
#include <gtest/gtest.h>

#include <vector>

#include "core/memory_budget.h"

namespace kvs {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryBudget, TheSmallerOfMemAvailableAndWhatTheCgroupLeaves) {
  const std::string meminfo = "MemTotal:       24683620 kB\nMemFree:        20000000 kB\nMemAvailable:   8388608 kB\n";
  EXPECT_EQ(memory_available_bytes(meminfo, "", ""), 8 * kGiB);
  EXPECT_EQ(memory_available_bytes(meminfo, "max\n", "1000\n"), 8 * kGiB);  // no limit
  EXPECT_EQ(memory_available_bytes(meminfo, std::to_string(4 * kGiB) + "\n", std::to_string(kGiB) + "\n"), 3 * kGiB);
  EXPECT_EQ(memory_available_bytes(meminfo, std::to_string(kGiB), std::to_string(2 * kGiB)), 0u);  // over it
  EXPECT_EQ(memory_available_bytes("", std::to_string(4 * kGiB), "0"), 4 * kGiB);
  EXPECT_EQ(memory_available_bytes("MemTotal: 1 kB\n", "max", ""), std::nullopt);
  // v1's "no limit"; the cgroup's inactive page cache counts as free (v2 and v1 names).
  EXPECT_EQ(memory_available_bytes(meminfo, "9223372036854771712\n", "3177570304\n"), 8 * kGiB);
  EXPECT_EQ(memory_available_bytes(meminfo, std::to_string(4 * kGiB), std::to_string(3 * kGiB),
                                   "anon 1073741824\ninactive_file " + std::to_string(kGiB) + "\nactive_file 5\n"),
            2 * kGiB);
  EXPECT_EQ(memory_available_bytes(meminfo, std::to_string(4 * kGiB), std::to_string(3 * kGiB),
                                   "cache 7\ntotal_inactive_file " + std::to_string(2 * kGiB) + "\n"),
            3 * kGiB);
}

TEST(MemoryBudget, ThisProcessAndMachineAreRead) {
#ifdef __linux__
  const auto available = memory_available_bytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0u);
  const ProcessMemory before = process_memory();
  EXPECT_GT(before.reserved, 0u);
  EXPECT_GT(before.resident, 0u);
  // 256 MiB reserved, then half of it written: reserved grows by all, resident by about half.
  std::vector<char>* big = new std::vector<char>();
  big->reserve(256u << 20);
  const ProcessMemory reserved = process_memory();
  for (size_t i = 0; i < (128u << 20); i += 4096) big->data()[i] = 1;
  const ProcessMemory touched = process_memory();
  EXPECT_GE(reserved.reserved - before.reserved, 256u << 20);
  EXPECT_LT(reserved.resident - before.resident, 16u << 20);
  EXPECT_GE(touched.resident - before.resident, 120u << 20);
  delete big;
#else
  GTEST_SKIP() << "/proc";
#endif
}

TEST(MemoryBudget, AShortfallIsOneLineWithTheSizesAndWhatToChange) {
  EXPECT_EQ(memory_shortfall(2 * kGiB, 1, 3 * kGiB), "");
  EXPECT_EQ(memory_shortfall(2 * kGiB, 1, std::nullopt), "");
  const std::string one = memory_shortfall(4 * kGiB, 1, 3 * kGiB);
  EXPECT_NE(one.find("will take 4 GiB more when its first step writes them, but this machine has 3 GiB available"),
            std::string::npos)
      << one;
  EXPECT_NE(one.find("lower train.micro_batch_size"), std::string::npos) << one;
  EXPECT_EQ(one.find('\n'), std::string::npos);
  // Four processes on the node each writing 1 GiB: 4 GiB against 3.
  const std::string four = memory_shortfall(kGiB, 4, 3 * kGiB);
  EXPECT_NE(four.find("4 GiB more when its first step writes them (1 GiB in each of this node's 4 processes)"),
            std::string::npos)
      << four;
  EXPECT_EQ(memory_shortfall(kGiB, 2, 3 * kGiB), "");
}

}  // namespace
}  // namespace kvs
