// Which source each index of a blend reads (data.shards.weights; docs/DATA.md
// "Blending sources").
//
// The weights become integer counts per period of kBlendPeriod indices (the
// shares rounded by largest remainder, ties to the earlier source), so the
// proportions hold exactly over every period. Inside a period, source s's
// k-th index sits where (k + 1/2) / counts[s] of the period has passed (ties
// to the earlier source), so the sources interleave evenly, as Megatron's
// blended datasets do. Index i of the blend is index (i / P) * counts[s] + k
// of its source s: each source is read in its own order, nothing skipped or
// repeated, and any index is found in O(1) from tables of P entries.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

constexpr uint32_t kBlendPeriod = uint32_t{1} << 16;

// Counts per period (summing to kBlendPeriod). Fails, naming `key` ("x.json:
// data.shards.weights"), when a weight is not a positive finite number or a
// share is below one index per period.
std::vector<uint32_t> blend_counts(const std::vector<double>& weights, const std::string& key);

class BlendSchedule {
 public:
  BlendSchedule(const std::vector<double>& weights, const std::string& key);

  struct Pick {
    size_t source;
    uint64_t index;  // the source's own index
  };
  Pick pick(uint64_t i) const;
  // The blend index at which source s reads its index k (pick's inverse).
  uint64_t position(size_t s, uint64_t k) const;
  size_t sources() const { return counts_.size(); }
  uint32_t count(size_t s) const { return counts_[s]; }  // indices per period
  double share(size_t s) const { return static_cast<double>(counts_[s]) / kBlendPeriod; }

 private:
  std::vector<uint32_t> counts_;
  std::vector<uint32_t> source_;                  // [P]: the source of each position of the period
  std::vector<uint32_t> rank_;                    // [P]: earlier positions of the period with that source
  std::vector<std::vector<uint32_t>> positions_;  // [s][k]: the position of source s's k-th index
};

}  // namespace kvs
