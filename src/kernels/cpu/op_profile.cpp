#include "kernels/cpu/op_profile.h"

#include <unordered_map>

namespace kvs::cpu::profile {

namespace {
std::vector<OpStat>& table() {
  static std::vector<OpStat> t;
  return t;
}
std::unordered_map<std::string, size_t>& index() {
  static std::unordered_map<std::string, size_t> i;
  return i;
}
}  // namespace

void set_enabled(bool on) { g_enabled = on; }

void add(const std::string& name, double seconds, double flops) {
  auto [it, fresh] = index().try_emplace(name, table().size());
  if (fresh) table().push_back({name, 0, 0, 0});
  OpStat& s = table()[it->second];
  s.seconds += seconds;
  s.flops += flops;
  ++s.calls;
}

std::vector<OpStat> take() {
  std::vector<OpStat> out;
  out.swap(table());
  index().clear();
  return out;
}

}  // namespace kvs::cpu::profile
