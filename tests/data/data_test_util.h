// What the data tests share: a fresh temporary directory per test binary run
// (removed at exit when the tests passed), and one sequence of a dataset read whole.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "data/dataset.h"

namespace kvs::testing_util {

// The <prefix><pid> roots fresh_temp_dir made, removed when the process exits
// if every test passed (a failure's files stay to be read).
struct TempRoots {
  std::vector<std::filesystem::path> roots;
  ~TempRoots() {
    if (!testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ec;
    for (const auto& r : roots) std::filesystem::remove_all(r, ec);
  }
};

// testing::TempDir()/<prefix><pid>/<name>, emptied.
inline std::string fresh_temp_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  static TempRoots made;
  const fs::path root = fs::path(testing::TempDir()) / (prefix + std::to_string(::getpid()));
  if (std::find(made.roots.begin(), made.roots.end(), root) == made.roots.end()) made.roots.push_back(root);
  fs::path d = root / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

struct Seq {
  std::vector<int32_t> in, tg;
  std::vector<float> mask;
  bool operator==(const Seq&) const = default;
};

inline Seq get_seq(const Dataset& ds, Split split, uint64_t index, int T) {
  Seq s{std::vector<int32_t>(T), std::vector<int32_t>(T), std::vector<float>(T)};
  ds.get(split, index, s.in.data(), s.tg.data(), s.mask.data());
  return s;
}

}  // namespace kvs::testing_util
