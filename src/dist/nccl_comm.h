// The NCCL backend of Communicator (built with KVS_CUDA only): device buffers,
// the communicator's own CUDA stream, non-blocking NCCL communicators polled
// against a deadline so that a missing or stuck rank ends in a kvs::Error on
// the ranks that are still alive instead of a hang (docs/LAUNCH.md).
//
// Collectives are synchronous: each one first waits for the device to be idle
// (so inputs written on any stream are complete), then returns once the result
// is in the buffer.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "dist/comm.h"
#include "dist/launch.h"

namespace kvs::dist {

// Binds this process to GPU local_rank % device count and returns its index.
int select_device(const LaunchInfo& info);

// A fresh NCCL unique id (NCCL_UNIQUE_ID_BYTES bytes); rank 0 makes it.
std::string nccl_unique_id();

// All ranks' communicator on `device`, from the id every rank holds. Init and
// every collective give up after `timeout_s` (and abort the communicator).
std::unique_ptr<Communicator> make_nccl(const LaunchInfo& info, const std::string& unique_id, int device,
                                        double timeout_s);

// Hands rank 0's id to every rank: bootstrap_exchange under torchrun, an
// MPI_Bcast under mpirun. Given rank 0's id (ignored elsewhere), returns it.
using ShareId = std::function<std::string(const std::string& id_on_rank0)>;

// select_device + nccl_unique_id on rank 0 + `share` + make_nccl.
std::unique_ptr<Communicator> make_nccl_world(const LaunchInfo& info, const ShareId& share, double timeout_s);

}  // namespace kvs::dist
