// Who am I among the processes of a run: rank, world size and local rank as
// the launcher set them (docs/LAUNCH.md).
//   - mpirun (OpenMPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//   - torchrun --no-python: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT;
//   - neither: a single process.
// Bad or contradictory values end in a one-line kvs::Error naming the variable.
#pragma once
#include <string>

namespace kvs::dist {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string launcher = "single";  // "single" | "mpirun" | "torchrun"
  std::string master_addr;          // torchrun's (or given to mpirun with -x); "" if unknown
  int master_port = 0;              // 0 if unknown
};

LaunchInfo detect_launch();

// Started as one of several processes by a launcher kvshift does not read
// (srun: SLURM_STEP_NUM_TASKS; MPICH/Intel MPI: PMI_SIZE; MVAPICH2): that
// world's size and this process's rank (SLURM_PROCID, PMI_RANK,
// MV2_COMM_WORLD_RANK; 0 if unset); world_size 1 otherwise.
LaunchInfo unread_launcher_world();

// "rank 1/4 local 1/4 launcher torchrun", for messages.
std::string describe(const LaunchInfo& info);

}  // namespace kvs::dist
