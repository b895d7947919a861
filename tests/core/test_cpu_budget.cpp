// core/cpu_budget.h: the cgroup CPU quota read from a cgroup tree (v2, v1,
// hybrid; a tree written here per case) and how it caps "all cores".
#include "core/cpu_budget.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace kvs {
namespace {

namespace fs = std::filesystem;

struct Tree {
  fs::path root;
  explicit Tree(const std::string& name) : root(fs::path(::testing::TempDir()) / ("kvs_cgroup_" + name)) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~Tree() { fs::remove_all(root); }
  void file(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
  std::optional<double> quota(const std::string& proc_cgroup) const {
    return cgroup_cpu_quota(proc_cgroup, root.string());
  }
};

TEST(CgroupCpuQuota, V2TakesTheSmallestLimitAlongThePath) {
  Tree t("v2");
  t.file("cgroup.controllers", "cpu memory\n");
  t.file("kubepods/pod1/ctr/cpu.max", "max 100000\n");
  t.file("kubepods/pod1/cpu.max", "250000 100000\n");
  t.file("kubepods/cpu.max", "800000 100000\n");
  EXPECT_DOUBLE_EQ(*t.quota("0::/kubepods/pod1/ctr\n"), 2.5);
  EXPECT_DOUBLE_EQ(*t.quota("0::/kubepods\n"), 8.0);
  t.file("kubepods/pod1/ctr/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(*t.quota("0::/kubepods/pod1/ctr\n"), 0.5);
}

TEST(CgroupCpuQuota, V2WithoutALimitOrWithGarbageIsNone) {
  Tree t("v2none");
  t.file("cgroup.controllers", "cpu\n");
  t.file("a/cpu.max", "max 100000\n");
  EXPECT_FALSE(t.quota("0::/a\n").has_value());
  t.file("a/cpu.max", "lots\n");
  EXPECT_FALSE(t.quota("0::/a\n").has_value());
  t.file("a/cpu.max", "0 100000\n");
  EXPECT_FALSE(t.quota("0::/a\n").has_value());
  EXPECT_FALSE(t.quota("").has_value());
}

TEST(CgroupCpuQuota, APathMissingUnderTheMountReadsTheMountsRoot) {
  // A container without a cgroup namespace sees the host's path in
  // /proc/self/cgroup but its own cgroup mounted at the root.
  Tree t("v2ns");
  t.file("cgroup.controllers", "cpu\n");
  t.file("cpu.max", "200000 100000\n");
  EXPECT_DOUBLE_EQ(*t.quota("0::/system.slice/docker-abc.scope\n"), 2.0);
}

TEST(CgroupCpuQuota, V1ReadsTheCpuControllersMount) {
  Tree t("v1");
  t.file("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  t.file("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  t.file("cpu,cpuacct/docker/cpu.cfs_quota_us", "-1\n");
  t.file("cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n");
  t.file("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  t.file("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  t.file("memory/docker/abc/memory.limit_in_bytes", "1\n");
  const std::string cg = "12:memory:/docker/abc\n4:cpuacct,cpu:/docker/abc\n0::/\n";
  // The controllers' own order names no mount here: the usual names are tried.
  EXPECT_DOUBLE_EQ(*t.quota(cg), 3.0);
  // cpuacct alone is not the cpu controller (asked while the quota still reads 3).
  EXPECT_FALSE(t.quota("3:cpuacct:/docker/abc\n").has_value());
  t.file("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_FALSE(t.quota(cg).has_value());
}

TEST(CgroupCpuQuota, HybridReadsTheUnifiedMount) {
  Tree t("hybrid");
  t.file("unified/user.slice/cpu.max", "150000 100000\n");
  EXPECT_DOUBLE_EQ(*t.quota("1:name=systemd:/user.slice\n0::/user.slice\n"), 1.5);
}

TEST(CpuBudget, AQuotaCapsTheAffinityMaskRoundedUp) {
  const CpuBudget capped = cpu_budget(64, 2.0);
  EXPECT_EQ(capped.threads, 2);
  EXPECT_NE(capped.note().find("2.00 CPUs"), std::string::npos) << capped.note();
  EXPECT_NE(capped.note().find("64 CPUs"), std::string::npos) << capped.note();
  EXPECT_EQ(cpu_budget(64, 1.5).threads, 2);
  EXPECT_EQ(cpu_budget(8, 0.3).threads, 1);
  const CpuBudget loose = cpu_budget(2, 1.5);  // the mask decides: no note
  EXPECT_EQ(loose.threads, 2);
  EXPECT_EQ(loose.note(), "");
  EXPECT_EQ(cpu_budget(4, 16.0).threads, 4);
  EXPECT_EQ(cpu_budget(4, std::nullopt).threads, 4);
  EXPECT_EQ(cpu_budget(0, std::nullopt).threads, 1);
}

TEST(CpuBudget, MoreThreadsThanTheBudgetGetAWarning) {
  const CpuBudget mask = cpu_budget(2, std::nullopt);
  EXPECT_EQ(mask.oversubscribed(2), "");
  EXPECT_EQ(mask.oversubscribed(1), "");
  const std::string w = mask.oversubscribed(8);
  EXPECT_NE(w.find("8 threads asked for"), std::string::npos) << w;
  EXPECT_NE(w.find("may use 2 CPUs:"), std::string::npos) << w;
  const std::string q = cpu_budget(64, 2.0).oversubscribed(16);
  EXPECT_NE(q.find("may use 2 CPUs (a cgroup CPU quota of 2.00)"), std::string::npos) << q;
  EXPECT_EQ(cpu_budget(64, 2.0).oversubscribed(2), "");
}

TEST(CpuBudget, ThisProcessResolvesZeroToItsBudgetAndKeepsAnExplicitCount) {
  EXPECT_EQ(resolve_threads(3), 3);
  EXPECT_EQ(resolve_threads(0), process_cpu_budget().threads);
  EXPECT_GE(process_cpu_budget().threads, 1);
  EXPECT_LE(process_cpu_budget().threads, process_cpu_budget().affinity_cpus);
}

// Ranks a launcher started on one node share it: unbound (mpirun --bind-to
// none, torchrun), every rank's mask is the whole node, so each takes its
// share; bound ranks keep their masks; a container's quota is the node's.
TEST(CpuBudget, RanksOnOneNodeShareItsCpus) {
  const CpuBudget unbound = cpu_budget(16, std::nullopt, 4, 16);
  EXPECT_EQ(unbound.threads, 4);
  EXPECT_NE(unbound.note().find("4 ranks share this node's 16 CPUs"), std::string::npos) << unbound.note();
  EXPECT_EQ(cpu_budget(2, std::nullopt, 2, 2).threads, 1);  // the development VM under mpirun -np 2
  EXPECT_EQ(cpu_budget(1, std::nullopt, 4, 16).threads, 1);  // --bind-to core
  EXPECT_EQ(cpu_budget(1, std::nullopt, 4, 16).note(), "");
  EXPECT_EQ(cpu_budget(8, std::nullopt, 4, 16).threads, 4);  // --bind-to socket: 2 ranks per socket
  EXPECT_EQ(cpu_budget(16, 8.0, 4, 16).threads, 2);          // the container's 8 CPUs over 4 ranks
  EXPECT_EQ(cpu_budget(3, std::nullopt, 8, 3).threads, 1);   // more ranks than CPUs: 1 each
  EXPECT_EQ(cpu_budget(16, std::nullopt, 1, 16).threads, 16);
}

}  // namespace
}  // namespace kvs
