// The live progress line: redrawn in place on a terminal, printed as a plain
// log line at most every few seconds otherwise (CI logs, pipes).
#pragma once
#include <chrono>
#include <string>

namespace kvs {

class ProgressLine {
 public:
  ProgressLine(int64_t total_steps, int64_t first_step);
  // Shows step (1-based count of finished steps), loss, lr and throughput.
  void update(int64_t step, double loss, double lr, double tokens_per_s, const std::string& extra = "");
  // Ends the in-place line before other output (a log line does it itself: core/log.h).
  void finish_line();

 private:
  int64_t total_, first_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_print_;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"
std::string format_count(double x);           // "12.3k", "4.56M"

}  // namespace kvs
