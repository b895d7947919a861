#include "core/runtime_env.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

extern "C" char* openblas_get_corename(void);

namespace kvs {

namespace {

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

std::string openblas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

void tune_runtime_environment(char** argv) {
  if (set_at_exec("KVS_NO_ENV_TUNING") || set_at_exec("KVS_ENV_TUNED")) return;
  if (set_at_exec("OMP_WAIT_POLICY") || set_at_exec("GOMP_SPINCOUNT")) return;
  setenv("GOMP_SPINCOUNT", "20000", 1);
  setenv("KVS_ENV_TUNED", "1", 1);  // never loop
  execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with the default settings.
}

}  // namespace kvs
