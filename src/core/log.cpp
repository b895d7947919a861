#include "core/log.h"

#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kvs {

void init_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("kvshift");
  logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

}  // namespace kvs
