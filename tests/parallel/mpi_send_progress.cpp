// A pipeline send moves while its sender computes (dist/mpi_comm.cpp's
// progress thread): rank 0 starts a 4 MiB isend and then stays out of MPI for
// 1.5 s; rank 1's receive must be done long before rank 0 calls wait. CTest
// runs this binary without OpenMPI's single-copy path (as in containers),
// where a message that size moves only while the sender is inside MPI: before
// the progress thread, the receive took the whole 1.5 s.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "parallel/mpi_world.h"

namespace kvs {
namespace {

using testing_util::world;
using Clock = std::chrono::steady_clock;

TEST(SendProgress, ASendMovesWhileItsSenderIsOutsideMpi) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int r = world().rank();
  const size_t n = size_t{1} << 20;  // 4 MiB of floats: far above any eager limit
  const auto away = std::chrono::milliseconds(1500);
  world().barrier();
  if (r == 0) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000);
    const int request = world().isend(x.data(), n, dist::DType::F32, 1, 5);
    std::this_thread::sleep_for(away);  // computing: no call into MPI
    world().wait(request);
  } else if (r == 1) {
    std::vector<float> y(n, -1);
    const auto t0 = Clock::now();
    world().recv(y.data(), n, dist::DType::F32, 0, 5);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    EXPECT_LT(ms, 500) << "the receive waited for the sender's wait()";
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(y[i], static_cast<float>(i % 1000)) << i;
  }
  world().barrier();
}

}  // namespace
}  // namespace kvs
