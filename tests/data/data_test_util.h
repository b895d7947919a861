// What the data tests share: a fresh temporary directory per test binary run,
// and one sequence of a dataset read whole.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace kvs::testing_util {

// testing::TempDir()/<prefix><pid>/<name>, emptied.
inline std::string fresh_temp_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::path(testing::TempDir()) / (prefix + std::to_string(::getpid())) / name;
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
