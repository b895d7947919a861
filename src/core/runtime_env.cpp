#include "core/runtime_env.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/blas_address_space.h"

namespace kvs {

namespace {

// The CPUs this process may run on as it was started (by taskset, mpirun
// --bind-to, a batch system). Saved before any library initialises: with
// OMP_PROC_BIND or OMP_PLACES set, libgomp binds the initial thread to its
// first place when it loads, and a re-executed program that inherited that
// one-place mask would run every OpenMP thread on one CPU (1.8x slower steps
// on 2 cores, measured). .preinit_array functions run before the shared
// libraries' constructors (this object is linked into every program that calls
// tune_runtime_environment).
cpu_set_t g_start_cpus;
bool g_have_start_cpus = false;
void save_start_cpus(int, char**, char**) {
  g_have_start_cpus = sched_getaffinity(0, sizeof g_start_cpus, &g_start_cpus) == 0;
}
__attribute__((section(".preinit_array"), used)) void (*const kvs_save_start_cpus)(int, char**, char**) =
    save_start_cpus;

// OpenBLAS's constructor would spin without a word where an address-space
// limit leaves no room for its per-thread buffers (core/blas_address_space.h):
// one line and exit 1 instead, before it runs.
void refuse_an_address_space_openblas_cannot_load_in(int, char**, char** envp) {
  cpu_set_t cpus;
  int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  const long conf = sysconf(_SC_NPROCESSORS_CONF);
  if (n <= 0 || (conf > 0 && conf < n)) n = conf > 0 ? static_cast<int>(conf) : 1;
  char line[512];
  if (openblas_fits_address_space(openblas_threads_at_load(envp, n), line, sizeof line)) return;
  const char prefix[] = "kvshift: error: ";
  (void)!write(2, prefix, sizeof prefix - 1);
  (void)!write(2, line, strlen(line));
  (void)!write(2, "\n", 1);
  _exit(1);
}
__attribute__((section(".preinit_array"), used)) void (*const kvs_refuse_small_address_space)(int, char**, char**) =
    refuse_an_address_space_openblas_cannot_load_in;

// Whether `name` was in the environment this process was started with
// (/proc/self/environ keeps the original block even if a library calls setenv).
bool set_at_exec(const std::string& name) {
  std::ifstream in("/proc/self/environ", std::ios::binary);
  if (!in) return std::getenv(name.c_str()) != nullptr;
  std::string entry;
  while (std::getline(in, entry, '\0'))
    if (entry.compare(0, name.size() + 1, name + "=") == 0) return true;
  return false;
}

}  // namespace

bool tunes_runtime_for(const char* subcommand) {
  if (!subcommand) return false;
  const std::string s = subcommand;
  return s == "train" || s == "bench" || s == "eval" || s == "generate";
}

void tune_runtime_environment(int argc, char** argv) {
  if (!tunes_runtime_for(argc > 1 ? argv[1] : nullptr)) return;
  if (set_at_exec("KVS_NO_ENV_TUNING") || set_at_exec("KVS_ENV_TUNED")) return;
  if (set_at_exec("OMP_WAIT_POLICY") || set_at_exec("GOMP_SPINCOUNT")) return;
  setenv("GOMP_SPINCOUNT", "20000", 1);
  setenv("KVS_ENV_TUNED", "1", 1);  // never loop
  cpu_set_t now;
  if (g_have_start_cpus && sched_getaffinity(0, sizeof now, &now) == 0 && !CPU_EQUAL(&now, &g_start_cpus))
    sched_setaffinity(0, sizeof g_start_cpus, &g_start_cpus);  // the new image starts where this one did
  execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with the default settings.
}

}  // namespace kvs
