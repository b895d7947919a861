// The hop-k task: see hopk.h and docs/DATA.md for the generation rule.
#include "data/hopk.h"

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"

namespace kvs {
namespace {

const uint64_t kTrainSalt = hash_name("kvshift/data/hopk/train");
const uint64_t kValSalt = hash_name("kvshift/data/hopk/val");

// One draw; false if some hop has no earlier occurrence.
bool draw_once(const HopkDataConfig& cfg, int seq_len, uint64_t seed, HopkSequence* s) {
  CounterRng rng{seed, 0};
  const uint64_t alphabet = static_cast<uint64_t>(cfg.token_hi - cfg.token_lo);
  s->tokens.resize(seq_len);
  // prev[i]: latest p < i with X[p] == X[i], or -1.
  std::vector<int> prev(seq_len, -1);
  std::unordered_map<int32_t, int> last;
  last.reserve(static_cast<size_t>(seq_len) * 2);
  for (int i = 0; i < seq_len; ++i) {
    int32_t x;
    if (i == 0) {
      x = static_cast<int32_t>(cfg.token_lo + rng.next_below(alphabet));
    } else {
      // Uniform over the alphabet minus the previous token (alphabet >= 2).
      const int32_t before = s->tokens[i - 1];
      x = static_cast<int32_t>(cfg.token_lo + rng.next_below(alphabet - 1));
      if (x >= before) ++x;
    }
    s->tokens[i] = x;
    auto it = last.find(x);
    if (it != last.end()) prev[i] = it->second;
    last[x] = i;
  }
  s->chain.assign(1, seq_len - 1);
  for (int h = 0; h < cfg.k; ++h) {
    const int p = prev[s->chain.back()];
    if (p < 0) return false;
    s->chain.push_back(p + 1);
  }
  s->answer = s->tokens[s->chain.back()];
  // Every position's chain: pos[t] = i_h(t) after h hops, -1 once broken.
  std::vector<int> pos(seq_len);
  for (int t = 0; t < seq_len; ++t) pos[t] = t;
  for (int h = 0; h < cfg.k; ++h)
    for (int t = 0; t < seq_len; ++t)
      if (pos[t] >= 0) pos[t] = prev[pos[t]] < 0 ? -1 : prev[pos[t]] + 1;
  s->answers.resize(seq_len);
  for (int t = 0; t < seq_len; ++t) s->answers[t] = pos[t] < 0 ? -1 : s->tokens[pos[t]];
  return true;
}

}  // namespace

HopkSequence generate_hopk(const HopkDataConfig& cfg, int seq_len, uint64_t seed) {
  KVS_CHECK(cfg.token_hi - cfg.token_lo >= 2 && cfg.k >= 1 && seq_len >= 1,
            "hopk: invalid config (alphabet [{}, {}), k {}, seq_len {})", cfg.token_lo, cfg.token_hi, cfg.k, seq_len);
  HopkSequence s;
  for (int attempt = 0; attempt < kHopkMaxAttempts; ++attempt) {
    if (draw_once(cfg, seq_len, attempt == 0 ? seed : mix_seed(seed, attempt), &s)) {
      s.attempts = attempt + 1;
      return s;
    }
  }
  fail("data.hopk: no sequence with {} hops found in {} draws (train.seq_len {}, alphabet [{}, {})): lower "
       "data.hopk.k, shrink the alphabet or raise train.seq_len",
       cfg.k, kHopkMaxAttempts, seq_len, cfg.token_lo, cfg.token_hi);
}

HopkDataset::HopkDataset(const HopkDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed)
    : cfg_(cfg), seq_len_(seq_len), seed_(seed) {
  KVS_CHECK(cfg.token_lo >= 0, "data.hopk.token_lo ({}) must be >= 0", cfg.token_lo);
  KVS_CHECK(cfg.token_hi - cfg.token_lo >= 2,
            "data.hopk.token_hi ({}): the alphabet [token_lo, token_hi) needs >= 2 tokens (token_lo {})", cfg.token_hi,
            cfg.token_lo);
  KVS_CHECK(cfg.token_hi <= vocab_size, "data.hopk.token_hi ({}) exceeds model.vocab_size ({})", cfg.token_hi,
            vocab_size);
  KVS_CHECK(cfg.k >= 1 && cfg.k <= seq_len - 2, "data.hopk.k ({}) must be in [1, train.seq_len - 2 = {}]", cfg.k,
            seq_len - 2);
}

void HopkDataset::get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const {
  const uint64_t salt = split == Split::Train ? kTrainSalt : kValSalt;
  const HopkSequence s = generate_hopk(cfg_, seq_len_, mix_seed(mix_seed(seed_, salt), index));
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = s.tokens[t];
    const bool defined = s.answers[t] >= 0;
    targets[t] = defined ? s.answers[t] : s.tokens[t];  // unscored target: any valid token
    mask[t] = defined ? 1.0f : 0.0f;
  }
}

std::string HopkDataset::describe() const {
  return fmt::format("hopk: k {}, alphabet [{}, {})", cfg_.k, cfg_.token_lo, cfg_.token_hi);
}

}  // namespace kvs
