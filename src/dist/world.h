// The world communicator for this process, chosen from how it was launched and
// the device it trains on (docs/LAUNCH.md):
//   - mpirun: MPI (host buffers), whatever the device;
//   - torchrun with WORLD_SIZE > 1: device "cuda" -> NCCL, its unique id handed
//     out by the TCP bootstrap, on GPU local_rank % device count; device "cpu"
//     -> a one-line error (the CPU collectives are MPI, which needs mpirun);
//   - no launcher, or a torchrun world of one: the single-process communicator.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"
#include "dist/launch.h"
#include "model/config_enums.h"

namespace kvs::dist {

// The backend make_world picks for this launch and device: "single", "mpi" or
// "nccl"; throws the torchrun-on-CPU error (and nothing else happens first).
std::string world_backend(const LaunchInfo& info, Device device);

// `device` is the config's.
std::unique_ptr<Communicator> make_world(Device device);

// Stops every rank after a failure on this one (MPI_Abort under MPI; nothing
// in a single process, where the caller just returns the error).
void abort_world(int code);

}  // namespace kvs::dist
