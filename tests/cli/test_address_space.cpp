// Under an address-space limit (ulimit -v) too small for OpenBLAS's per-thread
// buffers, kvshift stops with one line before OpenBLAS's constructor runs,
// where it used to spin forever before main() (core/blas_address_space.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "build_paths.h"
#include "core/blas_address_space.h"
#include "test_util.h"

namespace {

using kvs::openblas_threads_at_load;

int threads_with(std::vector<std::string> env, int cpus) {
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  return openblas_threads_at_load(envp.data(), cpus);
}

TEST(BlasAddressSpace, ThreadsAsOpenBlasCountsThemWhenItLoads) {
  EXPECT_EQ(threads_with({}, 2), 2);
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=1"}, 2), 1);
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=8"}, 2), 2);  // never more than the CPUs
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=3,1", "HOME=/"}, 8), 3);
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=4", "OPENBLAS_NUM_THREADS=2"}, 8), 2);
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=4", "GOTO_NUM_THREADS=3"}, 8), 3);
  EXPECT_EQ(threads_with({"OPENBLAS_NUM_THREADS=0", "OMP_NUM_THREADS=5"}, 8), 5);  // 0: not set
  EXPECT_EQ(threads_with({"OMP_NUM_THREADS=x", "XOMP_NUM_THREADS=3"}, 6), 6);
  EXPECT_EQ(threads_with({}, 256), kvs::kOpenBlasMaxThreads);
}

TEST(BlasAddressSpace, TheRefusalSaysWhatIsLeftAndWhatToSet) {
  char line[512];
  kvs::format_openblas_address_space_refusal(line, sizeof line, uint64_t{1100} << 20, uint64_t{1019} << 20, 2);
  EXPECT_EQ(std::string(line),
            "the address-space limit (ulimit -v) of 1100 MiB leaves 81 MiB beside the 1019 MiB the libraries map, "
            "and OpenBLAS maps 128 MiB for each of its 2 threads as it loads (it would wait forever): raise the "
            "limit to at least 1292 MiB (ulimit -v 1323008), or run fewer threads (OMP_NUM_THREADS)");
  kvs::format_openblas_address_space_refusal(line, sizeof line, uint64_t{1100} << 20, uint64_t{1019} << 20, 1);
  EXPECT_NE(std::string(line).find("each of its 1 thread as it loads"), std::string::npos) << line;
  EXPECT_EQ(std::string(line).find("fewer threads"), std::string::npos) << line;
}

// A failed allocation under a limit that it alone fits in: the clause names
// the limit, what is mapped and the limit that would do (what was mapped, the
// need and 256 MiB for the neighbours); nothing without a limit or when the
// need alone exceeds it (the caller's own advice then).
TEST(BlasAddressSpace, AFailedAllocationNamesTheLimitOnlyWhereTheLimitIsWhatStandsInTheWay) {
  const uint64_t MiB = uint64_t{1} << 20;
  EXPECT_EQ(kvs::address_space_limit_clause(245 * MiB, "this process maps", 1465 * MiB, 1359 * MiB),
            "the address-space limit (ulimit -v) of 1465 MiB leaves 106 MiB beside the 1359 MiB this process maps, "
            "and it needs about 245 MiB more: raise the limit to at least 1860 MiB (ulimit -v 1904640) or lift it");
  EXPECT_EQ(kvs::address_space_limit_clause(245 * MiB, "x", 0, 1359 * MiB), "");            // no limit
  EXPECT_EQ(kvs::address_space_limit_clause(2000 * MiB, "x", 1465 * MiB, 1359 * MiB), "");  // the need alone is over it
  EXPECT_NE(kvs::address_space_limit_clause(245 * MiB, "x", 1000 * MiB, 1359 * MiB).find("leaves 0 MiB"),
            std::string::npos);  // already over: nothing left, not a wrapped-around count
}

// Every limit from 256 MiB up to the first that runs `kvshift --help`: the
// loader's own error (the libraries do not fit), our one line, or help; never
// a run that hangs (before: 100-250 MiB of limits just above the libraries'
// own mappings spun until killed).
TEST(BlasAddressSpace, NoLimitLeavesTheProgramSpinningBeforeMain) {
  int refused = 0;
  bool ran = false;
  for (int mib = 256; mib <= 8192 && !ran; mib += 16) {
    SCOPED_TRACE("ulimit -v of " + std::to_string(mib) + " MiB");
    const auto r = kvs::testing_util::run_kvshift(
        "--help", "ulimit -v " + std::to_string(mib * 1024) + "; OMP_NUM_THREADS=2 timeout 60");
    ASSERT_NE(r.code, 124) << "hung: " << r.out;
    if (r.code == 0) {
      EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
      ran = true;
    } else if (r.code == 1) {
      EXPECT_EQ(r.out.rfind("kvshift: error: the address-space limit (ulimit -v) of " + std::to_string(mib) + " MiB", 0),
                0u)
          << r.out;
      EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
      ++refused;
    } else {
      EXPECT_NE(r.out.find("error while loading shared libraries"), std::string::npos) << r.code << ": " << r.out;
      EXPECT_EQ(refused, 0) << "the loader failed above a limit we refused: " << r.out;
    }
  }
  EXPECT_TRUE(ran);
  EXPECT_GE(refused, 8) << "a window of at least 128 MiB (one thread's buffer) in 16 MiB steps";
}

// The same for training on OpenBLAS's split GEMMs, whose threads map their
// buffers at their first product: from 1 GiB up, in 32 MiB steps, to the
// first limit a two-step run finishes under, no run hangs (before: about 300
// MiB of limits above what the model and libraries map spun in the first
// step), and some are refused with the line naming the threads' buffers.
TEST(BlasAddressSpace, NoLimitLeavesATrainingRunSpinningInItsFirstProduct) {
  kvs::testing_util::TmpDir tmp;
  int refused = 0;
  bool ran = false;
  for (int mib = 1024; mib <= 8192 && !ran; mib += 32) {
    SCOPED_TRACE("ulimit -v of " + std::to_string(mib) + " MiB");
    const std::string run = tmp / ("run" + std::to_string(mib));
    const auto r = kvs::testing_util::run_kvshift(
        "train --quiet --config " + std::string(kvs::test::source_dir()) + "/configs/toy/induction-1l-kvshift.json" +
            " --set train.steps=2 train.eval_every=0 train.checkpoint_every=0 --run-dir " + run,
        "ulimit -v " + std::to_string(mib * 1024) +
            "; KVS_CPU_GEMM=openblas KVS_CPU_GEMM_THREADS=split OMP_NUM_THREADS=2 timeout -s KILL 60");
    ASSERT_NE(r.code, 137) << "hung: " << r.out;
    if (r.code == 0) {
      ran = true;
    } else {
      EXPECT_FALSE(r.out.empty()) << "failed without a word";
      if (r.out.find("kvshift: error: the address-space limit (ulimit -v) of " + std::to_string(mib) +
                     " MiB leaves ") != std::string::npos &&
          r.out.find("and OpenBLAS maps 128 MiB for each of the 2 threads that call it") != std::string::npos)
        ++refused;
    }
  }
  EXPECT_TRUE(ran);
  EXPECT_GE(refused, 4) << "two threads' buffers (256 MiB) in 32 MiB steps";
}

}  // namespace
