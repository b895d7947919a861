#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kvs {

void validate_sampling(const SamplingConfig& c) {
  KVS_CHECK(std::isfinite(c.temperature) && c.temperature >= 0, "--temperature {} must be >= 0 (0 = greedy)",
            c.temperature);
  KVS_CHECK(c.top_k >= 0, "--top-k {} must be >= 0 (0 = off)", c.top_k);
  KVS_CHECK(c.top_p > 0 && c.top_p <= 1, "--top-p {} must be in (0, 1]", c.top_p);
}

int32_t argmax(const float* logits, int V) {
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
}

// A named stream of the seed, so generation draws never coincide with the
// draws another part of the project makes from the same seed.
Sampler::Sampler(const SamplingConfig& c) : c_(c), rng_{mix_seed(c.seed, hash_name("generate.sample")), 0} {
  validate_sampling(c);
}

int32_t Sampler::sample(const float* logits, int V) {
  if (c_.temperature == 0) return argmax(logits, V);
  order_.resize(V);
  std::iota(order_.begin(), order_.end(), 0);
  const size_t k = c_.top_k > 0 ? std::min<size_t>(c_.top_k, V) : V;
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), more_likely);
  order_.resize(k);
  // softmax(logits / T) over the candidates, in double.
  const double inv_t = 1.0 / c_.temperature, top = logits[order_[0]];
  probs_.resize(k);
  double sum = 0;
  // The most likely token(s) weigh exp(0) = 1 whatever T is: with a temperature so small that 1/T is
  // infinite, 0 * inf would be NaN and the draw would fall through to the least likely candidate.
  for (size_t i = 0; i < k; ++i) {
    const double d = logits[order_[i]] - top;
    sum += probs_[i] = d == 0 ? 1.0 : std::exp(d * inv_t);
  }
  // Nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  size_t n = k;
  if (c_.top_p < 1) {
    double mass = 0;
    for (n = 0; n < k;) {
      mass += probs_[n++] / sum;
      if (mass >= c_.top_p) break;
    }
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  const double u = rng_.next_uniform() * total;  // one draw per token, even when the choice is forced
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[n - 1];  // u == total after rounding
}

}  // namespace kvs
