// DeadlineGuard (core/deadline_guard.h): the time limit the NCCL backend puts
// around cudaDeviceSynchronize. Each test blocks the way that call would and
// lets the callbacks unblock it (or not).
#include "core/deadline_guard.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

namespace kvs {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(DeadlineGuard, ACallThatEndsInTimeRunsNeitherCallbackAndReturnsAtOnce) {
  std::atomic<int> deadline{0}, stuck{0};
  const auto t0 = Clock::now();
  {
    DeadlineGuard guard(30, 30, [&] { ++deadline; }, [&] { ++stuck; });
    EXPECT_FALSE(guard.fired());
  }
  EXPECT_LT(since(t0), 5.0);  // the destructor does not wait for the deadline
  EXPECT_EQ(deadline, 0);
  EXPECT_EQ(stuck, 0);
}

TEST(DeadlineGuard, PastTheDeadlineItRunsOnDeadlineWhichUnblocksTheCall) {
  std::promise<void> release;
  std::atomic<int> stuck{0};
  const auto t0 = Clock::now();
  bool fired = false;
  {
    DeadlineGuard guard(0.05, 30, [&] { release.set_value(); }, [&] { ++stuck; });
    // The "blocking call": waits until on_deadline releases it (at most 20 s, so a bug cannot hang the test).
    ASSERT_EQ(release.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
    fired = guard.fired();
  }
  EXPECT_TRUE(fired);
  EXPECT_GE(since(t0), 0.05);
  EXPECT_LT(since(t0), 10.0);  // neither the grace period nor the 20 s safety limit
  EXPECT_EQ(stuck, 0);
}

TEST(DeadlineGuard, ACallThatStaysBlockedAfterTheGracePeriodGetsOnStuck) {
  std::atomic<int> order{0}, deadline_at{0}, stuck_at{0};
  std::promise<void> stuck_called;
  const auto t0 = Clock::now();
  {
    DeadlineGuard guard(0.02, 0.05, [&] { deadline_at = ++order; },
                        [&] {
                          stuck_at = ++order;
                          stuck_called.set_value();
                        });
    // on_deadline does not unblock this call; only on_stuck ends the wait (in real use it ends the process).
    ASSERT_EQ(stuck_called.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_TRUE(guard.fired());
  }
  EXPECT_EQ(deadline_at, 1);
  EXPECT_EQ(stuck_at, 2);
  EXPECT_GE(since(t0), 0.07);
}

}  // namespace
}  // namespace kvs
