#include "core/signal_stack.h"

#include <omp.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>

namespace kvs {

void ensure_signal_stack() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return;  // one is set already
  // Never freed: the thread may take a signal until it ends. 64 KiB covers
  // the handlers (atomics and write(2)) and the kernel's frame with AVX-512 state.
  const size_t size = std::max<size_t>(64 * 1024, SIGSTKSZ);
  stack_t ss{};
  ss.ss_sp = std::malloc(size);
  if (!ss.ss_sp) return;
  ss.ss_size = size;
  ss.ss_flags = 0;
  if (sigaltstack(&ss, nullptr) != 0) std::free(ss.ss_sp);
}

void ensure_signal_stacks_on_omp_threads() {
  ensure_signal_stack();
  thread_local int prepared = 1;  // this thread's team size with stacks so far (libgomp keeps a team's threads)
  const int n = omp_get_max_threads();
  if (n <= prepared) return;
#pragma omp parallel num_threads(n)
  ensure_signal_stack();
  prepared = n;
}

int move_signal_handlers_to_alternate_stacks() {
  int moved = 0;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction cur {};
    if (::sigaction(sig, nullptr, &cur) != 0) continue;  // not a valid signal number here
    const bool handler = (cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != nullptr
                                                     : cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN;
    if (!handler || (cur.sa_flags & SA_ONSTACK)) continue;
    cur.sa_flags |= SA_ONSTACK;
    if (::sigaction(sig, &cur, nullptr) == 0) ++moved;
  }
  return moved;
}

}  // namespace kvs
