// main() of kvshift_mpi_tests (and of kvshift_cuda_host_mpi): GoogleTest on
// every rank of the MPI world.
// Only rank 0 prints the test results (KVS_TEST_EVERY_RANK=1: every rank,
// for a failure on another rank, which rank 0 may only see as a hang); the
// exit code is non-zero on every rank if any rank failed a test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "dist/mpi_comm.h"
#include "parallel/mpi_world.h"

namespace kvs::testing_util {
namespace {
dist::Communicator* g_world = nullptr;
}
dist::Communicator& world() { return *g_world; }
}  // namespace kvs::testing_util

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<kvs::dist::Communicator> world = kvs::dist::make_mpi_world();
  kvs::testing_util::g_world = world.get();
  if (world->rank() != 0 && !std::getenv("KVS_TEST_EVERY_RANK")) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  double failed = RUN_ALL_TESTS() != 0 ? 1.0 : 0.0;
  world->all_reduce(&failed, 1, kvs::dist::DType::F64, kvs::dist::ReduceOp::Max);
  return failed > 0 ? 1 : 0;
}
