// The MPI backend of Communicator (CPU buffers), for runs under mpirun.
// MpiRuntime is the one place MPI is initialised and finalised; every MPI
// communicator holds a reference to it, so MPI_Finalize runs after the last
// communicator is gone.
#pragma once
#include <memory>

#include "dist/comm.h"

namespace kvs::dist {

class MpiRuntime {
 public:
  // MPI_Init_thread(FUNNELED) unless MPI is already initialised; errors on
  // MPI_COMM_WORLD return codes (turned into kvs::Error) instead of aborting.
  MpiRuntime();
  ~MpiRuntime();  // MPI_Finalize if this object initialised MPI
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

// The world communicator over MPI_COMM_WORLD (initialises MPI on first use).
std::unique_ptr<Communicator> make_mpi_world();

// Seconds this process has spent waiting for other ranks in MPI collectives
// (0 without MPI): a step's time minus this is the rank's own work.
double collective_wait_seconds();

// MPI_Abort on MPI_COMM_WORLD when MPI is running (so every rank stops when
// one rank fails outside a collective); returns otherwise.
void mpi_abort_if_running(int code);

}  // namespace kvs::dist
