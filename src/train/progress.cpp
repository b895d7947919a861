#include "train/progress.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "core/log.h"

namespace kvs {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string format_count(double x) {
  if (x >= 1e9) return fmt::format("{:.2f}G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

ProgressLine::ProgressLine(int64_t total_steps, int64_t first_step)
    : total_(total_steps), first_(first_step), tty_(stderr_is_terminal()) {
  start_ = last_print_ = std::chrono::steady_clock::now();
}

void ProgressLine::update(int64_t step, double loss, double lr, double tokens_per_s, const std::string& extra) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  const bool last = step >= total_;
  if (!tty_ && !last && since_print < 5.0) return;
  if (tty_ && !last && since_print < 0.1) return;
  last_print_ = now;
  const int64_t done = step - first_;
  const double eta = done > 0 ? elapsed / done * (total_ - step) : NAN;
  const std::string line =
      fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | ETA {}{}", step, total_, loss, lr,
                  format_count(tokens_per_s), format_duration(eta), extra.empty() ? "" : " | " + extra);
  if (tty_) {
    progress_line_drawn();  // first: a log line from another thread ends it (core/log.h)
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void ProgressLine::finish_line() { end_progress_line(); }

}  // namespace kvs
