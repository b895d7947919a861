// Communicator::exchange over MPI (dist/comm.h): sends and receives posted
// together, the messages between two ranks matched in the order both post
// them, both directions in one call (the pipeline's device path posts its
// rounds so over NCCL; tests/cuda_host runs that path through the shim).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "parallel/mpi_world.h"

namespace kvs {
namespace {

using testing_util::world;

TEST(Exchange, MessagesBetweenTwoRanksMatchInTheOrderBothPostThem) {
  const int D = world().size(), r = world().rank();
  world().exchange({}, dist::DType::F32);  // nothing to do
  if (D == 1) {
    float x = 0;
    EXPECT_THROW(world().exchange({{true, &x, 1, 0}}, dist::DType::F32), Error);  // not a peer
    return;
  }
  const int next = (r + 1) % D, prev = (r + D - 1) % D;
  // To the next rank: 3 floats, then 5; to the previous: 2 (at 2 ranks the
  // same peer: the three in this order on both ends). Sends and receives
  // interleaved in the call: only each direction's order matters.
  std::vector<float> a(3, 10.0f * r + 1), b(5, 10.0f * r + 2), c(2, 10.0f * r + 3);
  std::vector<float> ra(3, -1), rb(5, -1), rc(2, -1);
  world().exchange({{false, ra.data(), 3, prev},
                    {true, a.data(), 3, next},
                    {false, rb.data(), 5, prev},
                    {true, b.data(), 5, next},
                    {true, c.data(), 2, prev},
                    {false, rc.data(), 2, next}},
                   dist::DType::F32);
  EXPECT_EQ(ra, std::vector<float>(3, 10.0f * prev + 1));
  EXPECT_EQ(rb, std::vector<float>(5, 10.0f * prev + 2));
  EXPECT_EQ(rc, std::vector<float>(2, 10.0f * next + 3));
}

}  // namespace
}  // namespace kvs
