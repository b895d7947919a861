#include "core/cpu_steal.h"

#include <fstream>
#include <sstream>

namespace kvs {

std::optional<CpuTimes> parse_cpu_times(const std::string& proc_stat) {
  std::istringstream in(proc_stat);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu ", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    CpuTimes t;
    unsigned long long v = 0;
    int n = 0;
    for (; n < 8 && fields >> v; ++n) {
      t.total += v;
      if (n == 7) t.steal = v;
    }
    if (n < 4) return std::nullopt;  // user nice system idle at least
    return t;
  }
  return std::nullopt;
}

std::optional<CpuTimes> read_cpu_times() {
  std::ifstream f("/proc/stat");
  if (!f) return std::nullopt;
  std::stringstream s;
  s << f.rdbuf();
  return parse_cpu_times(s.str());
}

double steal_fraction(const CpuTimes& a, const CpuTimes& b) {
  if (b.total <= a.total || b.steal < a.steal) return 0.0;
  return static_cast<double>(b.steal - a.steal) / static_cast<double>(b.total - a.total);
}

}  // namespace kvs
