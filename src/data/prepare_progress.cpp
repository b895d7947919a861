#include "data/prepare_progress.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "core/log.h"
#include "train/progress.h"

namespace kvs {

PrepareProgress::PrepareProgress(int64_t total_bytes, bool enabled)
    : total_(total_bytes), enabled_(enabled), tty_(stderr_is_terminal()) {
  start_ = last_ = std::chrono::steady_clock::now();
}

void PrepareProgress::add(int64_t bytes, int64_t docs) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_ += bytes;
  docs_ += docs;
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count();
  if (enabled_ && since >= (tty_ ? 0.2 : 5.0)) print_locked(false);
}

void PrepareProgress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (enabled_) print_locked(true);
}

void PrepareProgress::print_locked(bool final) {
  last_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_ - start_).count();
  const double rate = elapsed > 0 ? bytes_ / elapsed : 0;
  const double eta = rate > 0 ? (total_ - bytes_) / rate : NAN;
  const std::string line = fmt::format(
      "prepare: {:.1f}/{:.1f} MB ({:.0f}%) | {} docs | {:.2f} MB/s | {} {}", bytes_ / 1e6, total_ / 1e6,
      total_ > 0 ? 100.0 * bytes_ / total_ : 100.0, docs_, rate / 1e6, final ? "took" : "ETA",
      format_duration(final ? elapsed : eta));
  if (tty_) {
    progress_line_drawn();  // first: a log line from another thread ends it (core/log.h)
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    if (final) end_progress_line();
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace kvs
