// core/dir_lock: one process at a time in a run directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "core/dir_lock.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "kvs_dir_lock_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A second holder (another open file: flock conflicts between them as between
// processes) is refused, naming the directory and the holder's pid; once the
// first is released the file is gone and the directory can be taken again.
TEST(DirLock, ASecondHolderIsRefusedUntilTheFirstReleases) {
  const std::string d = fresh_dir("second");
  std::optional<kvs::DirLock> first(std::in_place, d);
  EXPECT_TRUE(fs::exists(d + "/" + kvs::DirLock::kFileName));
  EXPECT_KVS_ERROR(kvs::DirLock{d}, d + ": another kvshift train (pid " + std::to_string(::getpid()) + ")",
                   "kill -TERM", "another --run-dir");
  first.reset();
  EXPECT_FALSE(fs::exists(d + "/" + kvs::DirLock::kFileName));
  EXPECT_NO_THROW(kvs::DirLock{d});
  EXPECT_TRUE(fs::is_empty(d));
}

// A file left by a process that died holding it (no flock on it any more) is taken over.
TEST(DirLock, ALeftoverFileIsTakenOver) {
  const std::string d = fresh_dir("leftover");
  { std::ofstream(d + "/" + kvs::DirLock::kFileName) << "999999\n"; }
  EXPECT_NO_THROW(kvs::DirLock{d});
}

}  // namespace
