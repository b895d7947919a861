// Logging: spdlog to stderr with a short pattern. The live progress lines
// (train/progress.h, data/prepare_progress.h) are drawn in place on a terminal.
#pragma once
#include <spdlog/spdlog.h>

namespace kvs {

// level: "debug" | "info" | "warn" | "error"
void init_logging(const std::string& level = "info");
bool stderr_is_terminal();

// The world rank this process logs as (0 until a launched command has made its
// world). What every rank would find alike, as the data's warnings, is said by
// rank 0 only: one line for a job, not one per rank.
void set_log_rank(int rank);
bool logs_for_the_world();

// A progress line drawn in place on the terminal (no newline yet): the next log
// line, from any thread, first ends it, so a warning never lands on its tail.
void progress_line_drawn();
// Ends a progress line left open (prints the newline); false if none was.
bool end_progress_line();
// For a signal handler (async-signal-safe: an atomic only): whether a line was
// open, marking it ended; the handler writes the newline itself.
bool progress_line_open_for_signal_handler();

}  // namespace kvs
