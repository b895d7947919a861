// The paper's induction task (appendix D), deterministic per (seed, index).
//
// A sequence draws tokens uniformly (with replacement) from a pool of
// `pool_size` distinct ids in [token_lo, token_hi) (the pool itself depends on
// the sequence). A drawn token equal to the previous one is redrawn. When the
// drawn token A has appeared before and has a recorded successor B (the token
// that followed A's latest occurrence), the sequence gets "A B" and the
// position of A is scored with target B: an induction head must find the
// earlier A and copy what followed it. Otherwise the token is appended as is.
// Only induction positions are scored. After `max_repeats` induction events
// (0 = unlimited) the rest of the sequence is `pad_token`, as in the paper's
// script with max_repeats = 1. Train and validation use different seed salts.
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace kvs {

struct InductionSequence {
  std::vector<int32_t> tokens;    // seq_len + 1 tokens
  std::vector<uint8_t> scored;    // seq_len flags: position t predicts tokens[t+1] by induction
};

InductionSequence generate_induction(const InductionDataConfig& cfg, int seq_len, uint64_t seed);

class InductionDataset : public Dataset {
 public:
  InductionDataset(const InductionDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed);
  void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const override;
  uint64_t size(Split) const override { return UINT64_MAX; }
  std::string describe() const override;
  bool reports_accuracy() const override { return true; }
  std::string accuracy_name() const override { return "induction"; }

 private:
  InductionDataConfig cfg_;
  int seq_len_;
  uint64_t seed_;
};

}  // namespace kvs
