#include "kernels/cpu/op_profile.h"

namespace kvs::cpu::profile {

namespace {
kvs::profile::OpTable& table() {
  static kvs::profile::OpTable t;
  return t;
}
}  // namespace

void set_enabled(bool on) { g_enabled = on; }

void add(const std::string& name, double seconds, double flops) {
  table().add(name, seconds, flops, omp_get_max_threads());  // 1 inside a thread replica
}

std::vector<OpStat> take() { return table().take(); }

}  // namespace kvs::cpu::profile
