// Runtime settings that OpenMP reads from the environment when it loads,
// before main() runs, so they can only be changed by re-executing.
//
// GOMP_SPINCOUNT=20000: idle OpenMP threads spin briefly, then sleep. The
// default (300000 spins) is fastest on an idle machine but collapses when other
// processes share the cores (10x slower steps seen on a loaded 2-core machine);
// a short spin keeps small models fast and degrades gracefully.
//
// A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone, and
// KVS_NO_ENV_TUNING=1 disables the mechanism. The re-executed program starts
// on the CPUs this one was started on (not the one CPU that OMP_PROC_BIND
// binds the initial thread to before main).
#pragma once

namespace kvs {

// Call first thing in main(): re-executes the program once if a setting
// should change (the same process id, arguments and environment otherwise),
// for the subcommands that run many OpenMP regions (tunes_runtime_for). The
// others skip it: a re-execution loads every shared library again, 0.13 s of
// start-up with the CUDA libraries (cuBLASLt, NCCL, NVRTC, cuDNN) linked in,
// which scripts that call `kvshift forward` or `export-hf` many times pay on
// every call, for nothing.
void tune_runtime_environment(int argc, char** argv);

// Whether `subcommand` (argv[1], may be null) re-executes with the tuned
// settings: train, bench, eval and generate.
bool tunes_runtime_for(const char* subcommand);

}  // namespace kvs
