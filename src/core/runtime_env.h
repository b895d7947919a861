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
#include <string>

namespace kvs {

// Call first thing in main(): re-executes the program once if a setting
// should change (the same process id, arguments and environment otherwise).
void tune_runtime_environment(char** argv);

// The OpenBLAS kernel family in use ("Cooperlake", "Haswell", ...), for reports.
// OPENBLAS_CORETYPE in the environment overrides OpenBLAS's own detection.
std::string openblas_core_name();

}  // namespace kvs
