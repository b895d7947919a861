// The world communicator for this process, chosen from how it was launched.
#pragma once
#include <memory>

#include "dist/comm.h"

namespace kvs::dist {

// MPI when launched by mpirun (OMPI_COMM_WORLD_SIZE is set), otherwise the
// single-process communicator.
std::unique_ptr<Communicator> make_world();

// Stops every rank after a failure on this one (MPI_Abort under MPI; nothing
// in a single process, where the caller just returns the error).
void abort_world(int code);

}  // namespace kvs::dist
