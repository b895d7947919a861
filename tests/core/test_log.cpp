// core/log.h: a log line, from any thread, ends a progress line drawn in place first.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "core/log.h"

TEST(Log, ALogLineEndsAnOpenProgressLineFirst) {
  kvs::init_logging("info");
  testing::internal::CaptureStderr();
  std::fputs("\rstep 5/10 | loss 1.0", stderr);
  kvs::progress_line_drawn();
  std::thread([] { spdlog::warn("from another thread"); }).join();  // the step watchdog's case
  spdlog::info("no progress line open now");
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("loss 1.0\n["), std::string::npos) << out;
  EXPECT_EQ(out.find("thread\n\n"), std::string::npos) << "a second newline: " << out;
  EXPECT_FALSE(kvs::end_progress_line());
  kvs::progress_line_drawn();
  EXPECT_TRUE(kvs::progress_line_open_for_signal_handler());  // the stop-signal message's newline
  EXPECT_FALSE(kvs::end_progress_line());
}
