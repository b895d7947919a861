// The induction task: see induction.h and docs/DATA.md for the generation rule.
#include "data/induction.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "data/draw_distinct.h"

namespace kvs {
namespace {

// Salts that separate the train and validation streams of the same seed.
const uint64_t kTrainSalt = hash_name("kvshift/data/induction/train");
const uint64_t kValSalt = hash_name("kvshift/data/induction/val");

// If a sequence ends up with no induction event (possible only when the pool is
// large compared to the sequence), it is regenerated from a derived seed, as the
// paper's script does; after this many attempts the last one is returned as is.
constexpr int kMaxAttempts = 16;

// `pool_size` distinct ids of [lo, hi), in draw order.
std::vector<int32_t> draw_pool(int lo, int hi, int pool_size, CounterRng& rng) {
  const std::vector<uint64_t> drawn = draw_distinct(static_cast<uint64_t>(hi - lo), pool_size, rng);
  std::vector<int32_t> pool(drawn.size());
  for (size_t k = 0; k < drawn.size(); ++k) pool[k] = static_cast<int32_t>(lo + drawn[k]);
  return pool;
}

InductionSequence generate_once(const InductionDataConfig& cfg, int seq_len, uint64_t seed, int* events_out) {
  CounterRng rng{seed, 0};
  const std::vector<int32_t> pool = draw_pool(cfg.token_lo, cfg.token_hi, cfg.pool_size, rng);

  const size_t total = static_cast<size_t>(seq_len) + 1;
  InductionSequence s;
  s.tokens.reserve(total);
  s.scored.assign(seq_len, 0);
  // next_of[x]: the token that followed the LATEST occurrence of x. Updated for
  // every appended pair, including the "A B" pairs of induction events.
  std::unordered_map<int32_t, int32_t> next_of;
  next_of.reserve(static_cast<size_t>(cfg.pool_size) * 2);
  int events = 0;

  auto append = [&](int32_t tok) {
    if (!s.tokens.empty()) next_of[s.tokens.back()] = tok;
    s.tokens.push_back(tok);
  };
  auto draw_non_repeat = [&]() {
    // pool_size >= 2, so a token different from the previous one always exists.
    for (;;) {
      const int32_t x = pool[rng.next_below(pool.size())];
      if (s.tokens.empty() || x != s.tokens.back()) return x;
    }
  };

  while (s.tokens.size() < total) {
    if (cfg.max_repeats > 0 && events >= cfg.max_repeats) break;
    const size_t left = total - s.tokens.size();
    if (left == 1) {
      // Room for one token only: an induction event needs two. Append a token
      // never seen in this sequence (hence no repeat and nothing to predict), or pad.
      std::vector<int32_t> fresh;
      for (int32_t x : pool)
        if (!next_of.count(x) && (s.tokens.empty() || x != s.tokens.back())) fresh.push_back(x);
      if (!fresh.empty()) append(fresh[rng.next_below(fresh.size())]);
      break;
    }
    const int32_t a = draw_non_repeat();
    auto it = next_of.find(a);
    if (it != next_of.end()) {
      const int32_t b = it->second;
      s.scored[s.tokens.size()] = 1;  // position of A predicts B
      append(a);
      append(b);
      ++events;
    } else {
      append(a);
    }
  }
  while (s.tokens.size() < total) s.tokens.push_back(cfg.pad_token);
  *events_out = events;
  return s;
}

}  // namespace

InductionSequence generate_induction(const InductionDataConfig& cfg, int seq_len, uint64_t seed) {
  KVS_CHECK(seq_len >= 1, "induction: seq_len must be >= 1 (got {})", seq_len);
  KVS_CHECK(cfg.pool_size >= 2 && cfg.token_lo < cfg.token_hi && cfg.pool_size <= cfg.token_hi - cfg.token_lo,
            "induction: invalid pool (pool_size {} from [{}, {}))", cfg.pool_size, cfg.token_lo, cfg.token_hi);
  InductionSequence s;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    int events = 0;
    s = generate_once(cfg, seq_len, attempt == 0 ? seed : mix_seed(seed, attempt), &events);
    if (events > 0) break;
  }
  return s;
}

InductionDataset::InductionDataset(const InductionDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed)
    : cfg_(cfg), seq_len_(seq_len), seed_(seed) {
  KVS_CHECK(seq_len >= 1, "train.seq_len ({}) must be >= 1", seq_len);
  KVS_CHECK(cfg.token_hi <= vocab_size, "data.induction.token_hi ({}) exceeds model.vocab_size ({})", cfg.token_hi,
            vocab_size);
  KVS_CHECK(cfg.token_lo >= 0, "data.induction.token_lo ({}) must be >= 0", cfg.token_lo);
  KVS_CHECK(cfg.token_lo < cfg.token_hi, "data.induction.token_lo ({}) must be < data.induction.token_hi ({})",
            cfg.token_lo, cfg.token_hi);
  KVS_CHECK(cfg.pool_size >= 2, "data.induction.pool_size ({}) must be >= 2", cfg.pool_size);
  KVS_CHECK(cfg.pool_size <= cfg.token_hi - cfg.token_lo,
            "data.induction.pool_size ({}) exceeds the number of ids in [token_lo, token_hi) ({})", cfg.pool_size,
            cfg.token_hi - cfg.token_lo);
  KVS_CHECK(cfg.max_repeats >= 0, "data.induction.max_repeats ({}) must be >= 0 (0 = unlimited)", cfg.max_repeats);
  KVS_CHECK(cfg.pad_token >= 0 && cfg.pad_token < vocab_size,
            "data.induction.pad_token ({}) must be in [0, model.vocab_size = {})", cfg.pad_token, vocab_size);
  KVS_CHECK(cfg.pad_token < cfg.token_lo || cfg.pad_token >= cfg.token_hi,
            "data.induction.pad_token ({}) must lie outside [token_lo, token_hi) = [{}, {})", cfg.pad_token,
            cfg.token_lo, cfg.token_hi);
}

void InductionDataset::get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const {
  const uint64_t salt = split == Split::Train ? kTrainSalt : kValSalt;
  const InductionSequence s = generate_induction(cfg_, seq_len_, mix_seed(mix_seed(seed_, salt), index));
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = s.tokens[t];
    targets[t] = s.tokens[t + 1];
    mask[t] = s.scored[t] ? 1.0f : 0.0f;
  }
}

std::string InductionDataset::describe() const {
  std::string s = fmt::format("induction: tokens [{}, {}), pool {}", cfg_.token_lo, cfg_.token_hi, cfg_.pool_size);
  if (cfg_.max_repeats > 0) s += fmt::format(", max_repeats {}", cfg_.max_repeats);
  return s;
}

}  // namespace kvs
