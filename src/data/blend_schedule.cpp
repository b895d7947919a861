// The blend's period table: counts by largest remainder, then the sources'
// evenly spaced indices merged in order of their place in the period.
#include "data/blend_schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>

#include "core/error.h"

namespace kvs {

std::vector<uint32_t> blend_counts(const std::vector<double>& weights, const std::string& key) {
  KVS_CHECK(!weights.empty(), "{}: no weights", key);
  double total = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    if (!(std::isfinite(weights[s]) && weights[s] > 0)) fail("{}[{}]: must be > 0, got {}", key, s, weights[s]);
    total += weights[s];
  }
  KVS_CHECK(std::isfinite(total), "{}: the weights' sum is not finite", key);
  std::vector<uint32_t> counts(weights.size());
  std::vector<double> rest(weights.size());
  uint64_t given = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    const double exact = weights[s] / total * kBlendPeriod;
    counts[s] = static_cast<uint32_t>(std::floor(exact));
    rest[s] = exact - counts[s];
    given += counts[s];
  }
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t j = 0; given < kBlendPeriod; ++j, ++given) ++counts[order[j % order.size()]];
  for (size_t s = 0; s < weights.size(); ++s)
    if (counts[s] == 0)
      fail("{}[{}]: weight {} is {:.3g} of the total, under one sequence in {} (raise it, or leave the source out)",
           key, s, weights[s], weights[s] / total, kBlendPeriod);
  return counts;
}

BlendSchedule::BlendSchedule(const std::vector<double>& weights, const std::string& key)
    : counts_(blend_counts(weights, key)), source_(kBlendPeriod), rank_(kBlendPeriod), positions_(counts_.size()) {
  // Source s's k-th index belongs at (2k + 1) / (2 counts[s]) of the period:
  // a before b when (2ka + 1) counts[b] < (2kb + 1) counts[a] (exact in 64 bits).
  struct Next {
    uint64_t k;
    size_t s;
  };
  auto later = [&](const Next& a, const Next& b) {
    const uint64_t ta = (2 * a.k + 1) * counts_[b.s], tb = (2 * b.k + 1) * counts_[a.s];
    return ta != tb ? ta > tb : a.s > b.s;
  };
  std::priority_queue<Next, std::vector<Next>, decltype(later)> queue(later);
  for (size_t s = 0; s < counts_.size(); ++s) {
    queue.push({0, s});
    positions_[s].reserve(counts_[s]);
  }
  for (uint32_t p = 0; p < kBlendPeriod; ++p) {
    const Next n = queue.top();
    queue.pop();
    source_[p] = static_cast<uint32_t>(n.s);
    rank_[p] = static_cast<uint32_t>(n.k);
    positions_[n.s].push_back(p);
    if (n.k + 1 < counts_[n.s]) queue.push({n.k + 1, n.s});
  }
}

BlendSchedule::Pick BlendSchedule::pick(uint64_t i) const {
  const uint64_t block = i / kBlendPeriod;
  const uint32_t p = static_cast<uint32_t>(i % kBlendPeriod);
  const size_t s = source_[p];
  return {s, block * counts_[s] + rank_[p]};
}

uint64_t BlendSchedule::position(size_t s, uint64_t k) const {
  return (k / counts_[s]) * kBlendPeriod + positions_[s][k % counts_[s]];
}

}  // namespace kvs
