#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>

namespace kvs {
namespace {

std::atomic<bool> g_progress_line_open{false};
static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler reads it");

// stderr with colours, as spdlog's, but a progress line left open is ended first.
class LineEndingStderrSink final : public spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_mutex> {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    end_progress_line();
    ansicolor_stderr_sink::log(msg);
  }
};

}  // namespace

void progress_line_drawn() { g_progress_line_open.store(true); }

bool end_progress_line() {
  if (!g_progress_line_open.exchange(false)) return false;
  std::fputs("\n", stderr);
  return true;
}

bool progress_line_open_for_signal_handler() { return g_progress_line_open.exchange(false); }

void init_logging(const std::string& level) {
  auto logger = std::make_shared<spdlog::logger>("kvshift", std::make_shared<LineEndingStderrSink>());
  spdlog::drop("kvshift");  // called again (tests): the new one replaces it
  spdlog::register_logger(logger);
  logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

namespace {
std::atomic<int> g_log_rank{0};
}  // namespace

void set_log_rank(int rank) { g_log_rank = rank; }
bool logs_for_the_world() { return g_log_rank == 0; }

}  // namespace kvs
