// Logging: spdlog to stderr with a short pattern. The live progress line is
// separate (train/progress.h) and only drawn on a terminal.
#pragma once
#include <spdlog/spdlog.h>

namespace kvs {

// level: "debug" | "info" | "warn" | "error"
void init_logging(const std::string& level = "info");
bool stderr_is_terminal();

}  // namespace kvs
