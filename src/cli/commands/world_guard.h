// Runs a subcommand's body on the world communicator. Under MPI an error on
// one rank would leave the others waiting in their next collective, so the
// failing rank prints its one-line error and aborts the whole job. The body
// ends in a barrier: MPI_Finalize waits for every rank with no deadline, so a
// rank stuck (or stopped) after the last collective would keep the others
// there forever; the barrier's deadline (KVS_COLLECTIVE_TIMEOUT_S) names it
// and ends the job instead.
#pragma once
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/launch.h"
#include "dist/world.h"
#include "model/config.h"
#include "train/train_step.h"

namespace kvs::cli {

// An error line from one rank of a launched job. Every rank often hits the
// same error (a config typo, a diverged loss), and each printing it gave one
// copy per rank. Rank 0 prints at once; the others wait a moment first, so
// that when rank 0 failed too, its MPI_Abort or the launcher (mpirun and
// torchrun stop the job when a rank exits non-zero) has ended them before they
// repeat it. An error a rank hits alone still prints, that much later.
inline constexpr std::chrono::milliseconds kRepeatDelay{1500};
inline void print_rank_error(int rank, const char* what) {
  if (rank > 0) std::this_thread::sleep_for(kRepeatDelay);
  // kvs::Error's text is escaped already; a library's (a filesystem_error naming a path) is here.
  std::fprintf(stderr, "kvshift: error: %s\n", escape_control_characters(what).c_str());
  std::fflush(stderr);
}

template <class F>
void run_on_world(dist::Communicator& world, F&& body) {
  try {
    body();
    world.barrier();
  } catch (const std::exception& e) {
    if (world.size() == 1) throw;
    print_rank_error(world.rank(), e.what());
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

// For the subcommands that run in one process (forward, generate, export-hf,
// data prepare, ...): launched as several ranks, each would do the whole job
// (and write the same files). Rank 0 says so in one line; every rank exits 1,
// the others a second later, so that the launcher, which stops the job when a
// rank fails, does not stop rank 0 before its message is out.
inline void refuse_launched_ranks(const std::string& subcommand) {
  dist::LaunchInfo info;
  try {
    info = dist::detect_launch();
  } catch (const Error&) {
    // A launch environment these subcommands never use is not theirs to judge,
    // but several processes of srun (or another MPI) would each do the whole job.
    info = dist::unread_launcher_world();
  }
  if (info.world_size == 1) return;
  if (info.rank == 0) {
    std::fprintf(stderr,
                 "kvshift: error: %s runs in one process, but %s started %d ranks: run it without a launcher "
                 "(train, bench and eval are the subcommands that run across processes)\n",
                 subcommand.c_str(), info.launcher.c_str(), info.world_size);
    std::fflush(stderr);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::exit(1);
}

}  // namespace kvs::cli
