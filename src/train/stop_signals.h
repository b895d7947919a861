// Graceful stop on a signal (docs/RELIABILITY.md "Signals"): SIGTERM, SIGINT
// and one configurable signal (train.stop_signal, SIGUSR1 by default: what
// SLURM's --signal sends before a time limit) ask the run to finish its
// current step, write a checkpoint and exit with kExitStopped. A second
// SIGTERM/SIGINT exits at once (128 + signal) without touching anything:
// an interrupted save leaves only its temp directory, `latest` stays good.
// Signals within 250 ms of the first are that request delivered twice
// (`timeout`, launchers), not a second one.
// The handler only sets a flag (and writes one line with write(2)); the
// trainer reads it at step boundaries, where the ranks agree on it
// (step_watch.h). Instances nest: `kvshift train` holds one for the whole
// command, so a signal during start-up or after the last step is not a kill.
#pragma once
#include <signal.h>

#include <string>
#include <vector>

#include "model/config_enums.h"

namespace kvs {

// EX_TEMPFAIL (sysexits.h): stopped on request with a checkpoint; run again with --resume.
inline constexpr int kExitStopped = 75;

class StopSignals {
 public:
  // Installs the handlers; the destructor restores the previous
  // dispositions. `announce`: the handler prints its line (rank 0). (SIGXFSZ
  // is ignored by main for every subcommand.)
  StopSignals(StopSignal extra, bool announce);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first stop signal this process received, or 0.
  static int received();
  // "SIGTERM", "SIGUSR1", ...
  static std::string name(int sig);
  // Test hook: behave as if `sig` had arrived.
  static void simulate(int sig);

 private:
  struct Saved {
    int sig;
    struct sigaction old;
  };
  std::vector<Saved> saved_;
};

}  // namespace kvs
