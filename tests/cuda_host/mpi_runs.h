// Shared by the host engine's multi-process tests (mpi_parallel.cpp,
// mpi_pipeline.cpp): run directories and the shim's NCCL world over the MPI
// ranks of tests/parallel/mpi_world.h.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "parallel/mpi_world.h"

namespace kvs::testing_util {

// Removes, when the process exits, every entry of <tmp> whose name starts with
// the job's prefix: on rank 0 only (main's last collective has seen every rank
// finish its tests by then), and only if every test passed here, so that a
// failure's run directories stay to be read.
struct JobDirCleanup {
  std::string dir, stem;  // <tmp>/ and job<pid>_
  bool rank0 = false;
  ~JobDirCleanup() {
    if (!rank0 || !testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind(stem, 0) == 0) std::filesystem::remove_all(e.path(), ec);
  }
};

// <tmp>/job<pid of rank 0>_: one mpirun's directories apart from another's
// (ctest -j runs the np2 and np4 jobs of one binary at once); removed at exit
// when the tests passed (JobDirCleanup).
inline std::string job_dir_prefix() {
  static const std::string prefix = [] {
    int64_t pid = world().rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
    world().broadcast_bytes(&pid, sizeof(pid), 0);
    static JobDirCleanup cleanup{testing::TempDir(), "job" + std::to_string(pid) + "_", world().rank() == 0};
    return cleanup.dir + cleanup.stem;
  }();
  return prefix;
}

// A run directory of this rank alone: <job><prefix><name>_rank<r>, emptied.
inline std::string own_run_dir(const std::string& prefix, const std::string& name) {
  const std::string d = job_dir_prefix() + prefix + name + "_rank" + std::to_string(world().rank());
  std::filesystem::remove_all(d);
  return d;
}

// A run directory shared by the ranks (rank 0 writes it), emptied by rank 0
// before any rank goes on.
inline std::string shared_run_dir(const std::string& prefix, const std::string& name) {
  const std::string d = job_dir_prefix() + prefix + name;
  if (world().rank() == 0) std::filesystem::remove_all(d);
  world().barrier();
  return d;
}

// The NCCL world of the shim, over the MPI ranks (rank 0's unique id broadcast).
inline std::unique_ptr<dist::Communicator> shim_nccl_world() {
  dist::LaunchInfo info;
  info.rank = world().rank();
  info.world_size = world().size();
  info.local_rank = info.rank;
  info.local_world_size = info.world_size;
  info.launcher = "mpirun";
  std::string id = info.rank == 0 ? dist::nccl_unique_id() : std::string(128, '\0');
  world().broadcast_bytes(id.data(), id.size(), 0);
  return dist::make_nccl(info, id, 0, 60, 60);
}

}  // namespace kvs::testing_util
