// Alternate signal stacks: the calling thread's, and every OpenMP thread's.
//
// Why: oneDNN 2.6's JIT GEMM kernels point rsp at a heap workspace while they
// run (oneDNN issue #4845, fixed upstream in 3.11; Debian ships 2.6.3). A
// signal handler's frame is pushed below rsp, so a signal that arrives
// mid-GEMM overwrites that heap memory: wrong products, out-of-bounds writes
// and a corrupted heap (`kvshift train` stopped by SIGTERM aborted with
// "corrupted size vs. prev_size"). A handler installed with SA_ONSTACK runs on
// the thread's alternate stack instead, whatever rsp holds. Our handlers
// (train/stop_signals.h) use SA_ONSTACK; the oneDNN GEMM path
// (kernels/cpu/gemm_library.cpp) makes sure its threads have such a stack,
// and moves the handlers others installed before its first GEMM (an MPI
// library's, a sampling profiler's SIGPROF) onto those stacks too.
#pragma once

namespace kvs {

// Gives the calling thread an alternate signal stack (once per thread; a
// thread that already has one, ours or another's, keeps it).
void ensure_signal_stack();

// The same on every thread of an OpenMP team of omp_get_max_threads(),
// through one parallel region; again only when that count grows past what
// this thread's team already had. Call from outside any parallel region.
void ensure_signal_stacks_on_omp_threads();

// Adds SA_ONSTACK to every installed signal handler that lacks it (handler,
// mask and other flags kept; SIG_DFL and SIG_IGN left alone), so that whoever
// installed it, it runs on the alternate stack of a thread that has one.
// Returns how many it changed. A handler installed later is not covered.
int move_signal_handlers_to_alternate_stacks();

}  // namespace kvs
