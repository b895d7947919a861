#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <time.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/signal_stack.h"

namespace kvs {
namespace {

std::atomic<int> g_first{0};
std::atomic<int> g_count{0};
std::atomic<bool> g_announce{false};
std::atomic<int64_t> g_first_ns{0};  // when the first stop signal arrived (CLOCK_MONOTONIC)

// A stop signal this soon after the first is the same request delivered
// twice, not a second one: GNU timeout signals the child and then its process
// group, and a launcher (torchrun, mpirun) signals ranks that the terminal's
// Ctrl-C already reached, microseconds to milliseconds apart.
constexpr int64_t kSameRequestNs = 250'000'000;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// One write(2) per message, so that handlers running at once on two threads
// do not interleave their words (stdio's buffer is not ours to touch here).
void say(const char* a, const char* b, const char* c) {
  char line[256];
  size_t n = 0;
  // After an open progress line its own line.
  const char* first = progress_line_open_for_signal_handler() ? "\n" : "";
  for (const char* s : {first, a, b, c})
    for (; *s && n < sizeof line; ++s) line[n++] = *s;
  const ssize_t w = ::write(STDERR_FILENO, line, n);
  (void)w;
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
  const int64_t now = monotonic_ns();
  int64_t first_ns = 0;
  if (!g_first_ns.compare_exchange_strong(first_ns, now) && now - first_ns < kSameRequestNs) return;
  int expected = 0;
  g_first.compare_exchange_strong(expected, sig);
  const int n = g_count.fetch_add(1) + 1;
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
    g_first_ns = 0;
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
  int64_t none = 0;
  g_first_ns.compare_exchange_strong(none, monotonic_ns());
  g_count.fetch_add(1);
}

}  // namespace kvs
