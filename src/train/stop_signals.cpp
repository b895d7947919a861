#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/signal_stack.h"

namespace kvs {
namespace {

std::atomic<int> g_first{0};
std::atomic<int> g_count{0};
std::atomic<bool> g_announce{false};

void say(const char* a, const char* b, const char* c) {
  // After an open progress line its own line (stdio's buffer is not ours to touch here).
  const char* first = progress_line_open_for_signal_handler() ? "\n" : "";
  for (const char* s : {first, a, b, c}) {
    const ssize_t n = ::write(STDERR_FILENO, s, std::strlen(s));
    (void)n;
  }
}

const char* short_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

// Async-signal-safe: atomics, write(2) and _exit(2) only.
extern "C" void on_stop_signal(int sig) {
  const int n = g_count.fetch_add(1) + 1;
  int expected = 0;
  g_first.compare_exchange_strong(expected, sig);
  if (n == 1) {
    if (g_announce.load())
      say("kvshift: ", short_name(sig),
          sig == SIGTERM || sig == SIGINT
              ? " received: finishing this step, then writing a checkpoint (send it again to exit at once)\n"
              : " received: finishing this step, then writing a checkpoint (send SIGTERM to exit at once)\n");
    return;
  }
  // A repeated SIGUSR1 (SLURM may send it more than once) keeps waiting; a second SIGTERM/SIGINT does not.
  if (sig == SIGTERM || sig == SIGINT) {
    say("kvshift: second ", short_name(sig), ": exiting now; the last complete checkpoint is untouched\n");
    ::_exit(128 + sig);
  }
}

int signal_number(StopSignal s) {
  switch (s) {
    case StopSignal::Usr1: return SIGUSR1;
    case StopSignal::Usr2: return SIGUSR2;
    case StopSignal::Hup: return SIGHUP;
    case StopSignal::None: return 0;
  }
  return 0;
}

int g_depth = 0;  // nested instances (the CLI's around train()'s) share one request

}  // namespace

StopSignals::StopSignals(StopSignal extra, bool announce) {
  if (g_depth++ == 0) {
    g_first = 0;
    g_count = 0;
  }
  g_announce = announce;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: blocking calls (MPI, file I/O) carry on; the flag is read at step boundaries.
  // SA_ONSTACK: on the thread's alternate stack, never below a oneDNN GEMM's rsp (core/signal_stack.h).
  sa.sa_flags = SA_RESTART | SA_ONSTACK;
  ensure_signal_stack();
  std::vector<int> sigs = {SIGTERM, SIGINT};
  if (const int x = signal_number(extra)) sigs.push_back(x);
  for (int s : sigs) {
    Saved sv{s, {}};
    if (::sigaction(s, &sa, &sv.old) == 0) saved_.push_back(sv);
  }
}

StopSignals::~StopSignals() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) ::sigaction(it->sig, &it->old, nullptr);
  --g_depth;
}

int StopSignals::received() { return g_first.load(); }

std::string StopSignals::name(int sig) { return short_name(sig); }

void StopSignals::simulate(int sig) {
  int expected = 0;
  g_first.compare_exchange_strong(expected, sig);
  g_count.fetch_add(1);
}

}  // namespace kvs
