// Runs a subcommand's body on the world communicator. Under MPI an error on
// one rank would leave the others waiting in their next collective, so the
// failing rank prints its one-line error and aborts the whole job. The body
// ends in a barrier: MPI_Finalize waits for every rank with no deadline, so a
// rank stuck (or stopped) after the last collective would keep the others
// there forever; the barrier's deadline (KVS_COLLECTIVE_TIMEOUT_S) names it
// and ends the job instead.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "core/error.h"
#include "dist/world.h"
#include "model/config.h"
#include "train/train_step.h"

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

// Checks the config's parallel layout against the world's size
// (check_parallel_layout). Such an error is the same on every rank: rank 0
// reports it, and the barrier keeps every rank alive until it has (a rank
// exiting non-zero first would let mpirun kill rank 0 before its message is
// out); then every rank exits 1. In a single process the error is thrown.
inline void check_layout_or_exit(std::unique_ptr<dist::Communicator>& world, const Config& cfg) {
  try {
    check_parallel_layout(cfg, world->size());
  } catch (const Error& e) {
    if (world->size() == 1) throw;
    if (world->rank() == 0) {
      std::fprintf(stderr, "kvshift: error: %s\n", e.what());
      std::fflush(stderr);
    }
    world->barrier();
    world.reset();
    std::exit(1);
  }
}

}  // namespace kvs::cli
