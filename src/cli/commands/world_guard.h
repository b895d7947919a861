// Runs a subcommand's body on the world communicator. Under MPI an error on
// one rank would leave the others waiting in their next collective, so the
// failing rank prints its one-line error and aborts the whole job. The body
// ends in a barrier: MPI_Finalize waits for every rank with no deadline, so a
// rank stuck (or stopped) after the last collective would keep the others
// there forever; the barrier's deadline (KVS_COLLECTIVE_TIMEOUT_S) names it
// and ends the job instead.
#pragma once
#include <cstdio>
#include <exception>

#include "dist/world.h"

namespace kvs::cli {

template <class F>
void run_on_world(dist::Communicator& world, F&& body) {
  try {
    body();
    world.barrier();
  } catch (const std::exception& e) {
    if (world.size() == 1) throw;
    std::fprintf(stderr, "kvshift: error: %s\n", e.what());
    std::fflush(stderr);
    dist::abort_world(1);
    throw;  // not reached under MPI
  }
}

}  // namespace kvs::cli
