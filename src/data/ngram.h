// The paper's 3-gram memorisation task (section 3.3, Figure 3), deterministic
// per (seed, split, index).
//
// A table of `num_pairs` distinct pairs (x1, x2), each with a random x3, is
// drawn once from `table_seed` (not from train.seed, and the same for train and
// validation: the table is what the model memorises). A sequence is a stream of
// table triples "x1 x2 x3 x1 x2 x3 ...", each triple drawn uniformly from the
// table; the positions whose target is an x3 (the x2 positions) are scored.
// See docs/DATA.md for the exact rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace kvs {

struct NgramEntry {
  int32_t x1, x2, x3;
};

// The table of a config: `num_pairs` entries with distinct (x1, x2), in draw order.
std::vector<NgramEntry> make_ngram_table(const NgramDataConfig& cfg);

class NgramDataset : public Dataset {
 public:
  NgramDataset(const NgramDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed);
  void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const override;
  uint64_t size(Split) const override { return UINT64_MAX; }
  std::string describe() const override;
  bool reports_accuracy() const override { return true; }
  std::string accuracy_name() const override { return "3-gram"; }
  const std::vector<NgramEntry>& table() const { return table_; }

 private:
  NgramDataConfig cfg_;
  int seq_len_;
  uint64_t seed_;
  std::vector<NgramEntry> table_;
};

}  // namespace kvs
