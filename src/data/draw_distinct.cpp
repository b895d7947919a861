#include "data/draw_distinct.h"

#include <unordered_map>

namespace kvs {

std::vector<uint64_t> draw_distinct(uint64_t range, int n, CounterRng& rng) {
  std::unordered_map<uint64_t, uint64_t> swapped;
  swapped.reserve(static_cast<size_t>(n) * 2);
  auto at = [&](uint64_t i) {
    auto it = swapped.find(i);
    return it == swapped.end() ? i : it->second;
  };
  std::vector<uint64_t> out(n);
  for (int k = 0; k < n; ++k) {
    const uint64_t j = k + rng.next_below(range - k);
    const uint64_t vj = at(j), vk = at(k);
    swapped[j] = vk;
    swapped[k] = vj;
    out[k] = vj;
  }
  return out;
}

}  // namespace kvs
