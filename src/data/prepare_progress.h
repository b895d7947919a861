// The live progress line of `kvshift data prepare`: bytes and documents done,
// MB/s and ETA on stderr; redrawn in place on a terminal, a plain line every
// few seconds otherwise. Thread-safe: encoding threads report as they finish.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>

namespace kvs {

class PrepareProgress {
 public:
  PrepareProgress(int64_t total_bytes, bool enabled);
  void add(int64_t bytes, int64_t docs);
  void finish();  // prints the final line

 private:
  void print_locked(bool final);
  int64_t total_, bytes_ = 0, docs_ = 0;
  bool enabled_, tty_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace kvs
