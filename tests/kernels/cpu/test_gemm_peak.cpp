// The calibrated SGEMM peak's cache (kernels/cpu/gemm_peak.h): written and
// read back per CPU model, library, threading and thread count; a cache that
// cannot be parsed or read (here a directory where the file belongs) is
// measured around, never an error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/gemm_peak.h"
#include "test_util.h"

namespace kvs::cpu {
namespace {

using kvs::testing_util::TmpDir;

// XDG_CACHE_HOME set while it lives.
class CacheHome {
 public:
  explicit CacheHome(const std::string& dir) {
    if (const char* v = std::getenv("XDG_CACHE_HOME")) before_ = v;
    ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  }
  ~CacheHome() {
    if (before_) ::setenv("XDG_CACHE_HOME", before_->c_str(), 1);
    else ::unsetenv("XDG_CACHE_HOME");
  }

 private:
  std::optional<std::string> before_;
};

TEST(GemmPeak, TheCacheIsWrittenAndReadBackAndABrokenOneIsMeasuredAround) {
  TmpDir tmp;
  const CacheHome home(tmp.str());
  const std::string file = tmp / "kvshift/sgemm_peak.json";
  std::filesystem::create_directories(tmp / "kvshift");
  { std::ofstream(file) << "{not json"; }
  const GemmLibrary lib_before = gemm_library();
  const GemmThreading threading_before = gemm_threading();
  const GemmPeak measured = sgemm_peak(1, false);
  EXPECT_GT(measured.gflops, 0);
  EXPECT_FALSE(measured.cached);
  EXPECT_EQ(gemm_library(), lib_before);
  EXPECT_EQ(gemm_threading(), threading_before);
  // Rewritten as JSON, one entry per library on one thread (nothing to split there).
  nlohmann::json cache;
  ASSERT_NO_THROW(cache = nlohmann::json::parse(std::ifstream(file)));
  ASSERT_TRUE(cache.is_object());
  EXPECT_GE(cache.size(), 1u);
  for (const auto& [key, entry] : cache.items()) {
    EXPECT_EQ(key.rfind(cpu_identity() + " | ", 0), 0u) << key;
    EXPECT_NE(key.find(" | 1 threads"), std::string::npos) << key;
    EXPECT_EQ(key.find(", split"), std::string::npos) << key;
    EXPECT_GT(entry.at("gflops").get<double>(), 0) << key;
  }
  const GemmPeak again = sgemm_peak(1, false);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.gflops, measured.gflops);
  EXPECT_EQ(again.core, measured.core);
  // The file's place taken by a directory: unreadable, measured again.
  std::filesystem::remove(file);
  std::filesystem::create_directory(file);
  GemmPeak around;
  ASSERT_NO_THROW(around = sgemm_peak(1, false));
  EXPECT_GT(around.gflops, 0);
  EXPECT_FALSE(around.cached);
}

// VMs mask the model name ("AMD EPYC" on Zen 3, 4 and 5): the key carries
// the family, model and stepping too, so generations sharing a home do not
// share a peak.
TEST(GemmPeak, TheCachesKeyNamesTheCpusFamilyModelAndStepping) {
#if defined(__x86_64__) && defined(__linux__)
  const std::string id = cpu_identity();
  EXPECT_NE(id.find(" (family "), std::string::npos) << id;
  EXPECT_NE(id.find(", model "), std::string::npos) << id;
  EXPECT_NE(id.find(", stepping "), std::string::npos) << id;
  EXPECT_EQ(id.find("(family ,"), std::string::npos) << id;
  EXPECT_EQ(id.find("model name"), std::string::npos) << id;
#else
  GTEST_SKIP() << "/proc/cpuinfo's x86 fields";
#endif
}

}  // namespace
}  // namespace kvs::cpu
