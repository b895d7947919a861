// Choosing the next token from logits: greedy, temperature, top-k and top-p
// (nucleus). Draws come from the project's counter RNG, so the same seed
// gives the same tokens on any machine.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace kvs {

struct SamplingConfig {
  double temperature = 1.0;  // 0 = greedy (argmax, first maximum)
  int top_k = 0;             // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose mass reaches p; 1 = all
  uint64_t seed = 0;
};

// Throws kvs::Error naming the flag for a value outside its range.
void validate_sampling(const SamplingConfig& c);

class Sampler {
 public:
  explicit Sampler(const SamplingConfig& c);
  // One token from logits [V]. Candidates are ordered by logit (ties: lower
  // id first), so top-k 1 and a tiny top-p both give the argmax.
  int32_t sample(const float* logits, int V);

 private:
  SamplingConfig c_;
  CounterRng rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

int32_t argmax(const float* logits, int V);  // first maximum

}  // namespace kvs
