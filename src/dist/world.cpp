#include "dist/world.h"

#include <cstdlib>

#include "dist/mpi_comm.h"

namespace kvs::dist {

std::unique_ptr<Communicator> make_world() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return make_mpi_world();
  return make_single_process();
}

void abort_world(int code) { mpi_abort_if_running(code); }

}  // namespace kvs::dist
