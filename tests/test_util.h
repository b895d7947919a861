// Helpers shared by the GoogleTest files: a fresh directory per test, whole-file
// read/write, and a check that a call throws a one-line kvs::Error with given parts.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "build_paths.h"
#include "core/error.h"

namespace kvs::testing_util {

class TmpDir {
 public:
  TmpDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             (std::string("kvs_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid())))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TmpDir(const TmpDir&) = delete;
  TmpDir& operator=(const TmpDir&) = delete;
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void spit(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// The kvs::Error message of `fn`, or "" if it did not throw one.
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const kvs::Error& e) {
    return e.what();
  }
  return "";
}

// The kvshift binary run through the shell, as a user runs it.
struct CommandResult {
  int code;
  std::string out;  // stdout and stderr together
};

// `prefix` goes in front of the binary (e.g. "env -u X Y=1"; may be empty).
inline CommandResult run_kvshift(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + " " + std::string(kvs::test::cli_binary()) + " " + args + " 2>&1";
  CommandResult r{0, ""};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) r.out += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kvs::testing_util

// `expr` must throw a kvs::Error whose message is one line containing every given part.
#define EXPECT_KVS_ERROR(expr, ...)                                                           \
  do {                                                                                        \
    const std::string msg_ = ::kvs::testing_util::error_of([&] { (void)(expr); });            \
    ASSERT_FALSE(msg_.empty()) << #expr " did not throw kvs::Error";                          \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << msg_;                                    \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})                   \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "missing '" << part_ << "' in: " << msg_; \
  } while (0)
