// The NCCL backend's time limit on the device-idle wait before a collective
// (nccl_comm.cpp, wait_device_idle): a device that stays busy, as it does
// when another stream holds a collective whose peer died, ends in a one-line
// error after the timeout, or, if aborting the communicators does not free
// it, in the process ending with that line. The shim's
// stall_next_device_sync plays the stuck kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/error.h"
#include "dist/nccl_comm.h"
#include "hostcuda.h"

namespace kvs {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<dist::Communicator> world_of_one(double collective_timeout_s) {
  dist::LaunchInfo info;
  info.world_size = info.local_world_size = 1;
  return dist::make_nccl(info, dist::nccl_unique_id(), 0, 30, collective_timeout_s);
}

TEST(HostNcclDeadline, ACollectiveBehindAStuckDeviceFailsAfterTheTimeoutInsteadOfHanging) {
  auto comm = world_of_one(0.3);
  float x = 1;
  comm->all_reduce(&x, 1, dist::DType::F32, dist::ReduceOp::Sum);  // a free device: no wait
  EXPECT_EQ(x, 1.0f);

  // Stuck until the communicators are aborted (an NCCL kernel ends then); 30 s: the hang this test must not see.
  hostcuda::stall_next_device_sync(30, /*until_nccl_abort=*/true);
  const auto t0 = Clock::now();
  std::string msg;
  try {
    comm->all_reduce(&x, 1, dist::DType::F32, dist::ReduceOp::Sum);
  } catch (const Error& e) {
    msg = e.what();
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_NE(msg.find("NCCL all_reduce on rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not become idle within 0.3 s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("communicator of this process aborted"), std::string::npos) << msg;
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 10.0);

  // The communicator is unusable afterwards, and says so.
  try {
    comm->barrier();
    ADD_FAILURE() << "a barrier on an aborted communicator returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier error"), std::string::npos) << e.what();
  }
}

TEST(HostNcclDeadline, ADeviceStillBusyAfterTheAbortEndsTheProcessWithTheError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto comm = world_of_one(0.2);
        float x = 1;
        // A kernel that aborting NCCL does not end: only the 30 s cap would.
        hostcuda::stall_next_device_sync(30, /*until_nccl_abort=*/false);
        comm->all_reduce(&x, 1, dist::DType::F32, dist::ReduceOp::Sum);
      },
      ::testing::ExitedWithCode(1), "did not become idle within 0.2 s.*still busy: ending the process");
}

}  // namespace
}  // namespace kvs
