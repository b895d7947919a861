// Multi-hop induction (appendix H of the paper, after Sanford et al. 2024,
// "Transformers, parallel computation, and logarithmic depth": hop_k),
// deterministic per (seed, split, index).
//
// A sequence X[0..T) (T = train.seq_len) draws tokens uniformly from the
// alphabet [token_lo, token_hi), never repeating the previous token. For a
// position i, hop(i) = p + 1 where p < i is the latest earlier position with
// X[p] = X[i] ("find the previous occurrence of the current token and move to
// what followed it"). Starting at i_0 = T - 1, i_h = hop(i_{h-1}); the answer
// is X[i_k]. Like Sanford et al., every position t whose k-hop chain exists
// is scored with target = hop_k(X)_t (dense supervision: the single-position
// version gave one bit of signal per sequence and did not learn at toy scale).
// A draw where the last position's chain does not exist is redrawn from a
// derived seed (bounded attempts, then an error). See docs/DATA.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace kvs {

struct HopkSequence {
  std::vector<int32_t> tokens;  // X[0..T)
  std::vector<int> chain;       // i_0 = T - 1, i_1, ..., i_k (strictly decreasing)
  int32_t answer = 0;           // X[i_k]
  std::vector<int32_t> answers; // hop_k(X)_t for every position t, -1 where the chain breaks
  int attempts = 0;             // draws it took (1 = the first)
};

// Attempts before giving up (the error names data.hopk and train.seq_len).
constexpr int kHopkMaxAttempts = 64;

HopkSequence generate_hopk(const HopkDataConfig& cfg, int seq_len, uint64_t seed);

class HopkDataset : public Dataset {
 public:
  HopkDataset(const HopkDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed);
  void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const override;
  uint64_t size(Split) const override { return UINT64_MAX; }
  std::string describe() const override;
  bool reports_accuracy() const override { return true; }
  std::string accuracy_name() const override { return "hop-k"; }

 private:
  HopkDataConfig cfg_;
  int seq_len_;
  uint64_t seed_;
};

}  // namespace kvs
