// The 3-gram task: see ngram.h and docs/DATA.md for the generation rule.
#include "data/ngram.h"

#include <fmt/format.h>


#include "core/error.h"
#include "core/rng.h"
#include "data/draw_distinct.h"

namespace kvs {
namespace {

const uint64_t kTableSalt = hash_name("kvshift/data/ngram/table");
const uint64_t kTrainSalt = hash_name("kvshift/data/ngram/train");
const uint64_t kValSalt = hash_name("kvshift/data/ngram/val");

}  // namespace

std::vector<NgramEntry> make_ngram_table(const NgramDataConfig& cfg) {
  const uint64_t range = static_cast<uint64_t>(cfg.token_hi - cfg.token_lo);
  KVS_CHECK(cfg.token_lo < cfg.token_hi && cfg.num_pairs >= 1 && static_cast<uint64_t>(cfg.num_pairs) <= range * range,
            "ngram: invalid table ({} pairs from [{}, {}))", cfg.num_pairs, cfg.token_lo, cfg.token_hi);
  CounterRng rng{mix_seed(kTableSalt, cfg.table_seed), 0};
  const std::vector<uint64_t> pairs = draw_distinct(range * range, cfg.num_pairs, rng);
  std::vector<NgramEntry> table(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    table[i].x1 = static_cast<int32_t>(cfg.token_lo + pairs[i] / range);
    table[i].x2 = static_cast<int32_t>(cfg.token_lo + pairs[i] % range);
    table[i].x3 = static_cast<int32_t>(cfg.token_lo + rng.next_below(range));
  }
  return table;
}

NgramDataset::NgramDataset(const NgramDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed)
    : cfg_(cfg), seq_len_(seq_len), seed_(seed) {
  KVS_CHECK(seq_len >= 2, "train.seq_len ({}) must be >= 2 for the ngram task", seq_len);
  KVS_CHECK(cfg.token_lo >= 0, "data.ngram.token_lo ({}) must be >= 0", cfg.token_lo);
  KVS_CHECK(cfg.token_lo < cfg.token_hi, "data.ngram.token_lo ({}) must be < data.ngram.token_hi ({})", cfg.token_lo,
            cfg.token_hi);
  KVS_CHECK(cfg.token_hi <= vocab_size, "data.ngram.token_hi ({}) exceeds model.vocab_size ({})", cfg.token_hi,
            vocab_size);
  const int64_t range = cfg.token_hi - cfg.token_lo;
  KVS_CHECK(cfg.num_pairs >= 1 && cfg.num_pairs <= range * range,
            "data.ngram.num_pairs ({}) must be in [1, (token_hi - token_lo)^2 = {}]", cfg.num_pairs, range * range);
  table_ = make_ngram_table(cfg);
}

void NgramDataset::get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const {
  const uint64_t salt = split == Split::Train ? kTrainSalt : kValSalt;
  CounterRng rng{mix_seed(mix_seed(seed_, salt), index), 0};
  // seq_len + 1 tokens x[0..T]: triple j occupies x[3j], x[3j+1], x[3j+2].
  std::vector<int32_t> x(static_cast<size_t>(seq_len_) + 1);
  for (size_t p = 0; p < x.size(); p += 3) {
    const NgramEntry& e = table_[rng.next_below(table_.size())];
    x[p] = e.x1;
    if (p + 1 < x.size()) x[p + 1] = e.x2;
    if (p + 2 < x.size()) x[p + 2] = e.x3;
  }
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = x[t];
    targets[t] = x[t + 1];
    mask[t] = t % 3 == 1 ? 1.0f : 0.0f;  // the x2 position predicts x3
  }
}

std::string NgramDataset::describe() const {
  return fmt::format("ngram: 3-gram table of {} pairs over tokens [{}, {}), table_seed {}", cfg_.num_pairs,
                     cfg_.token_lo, cfg_.token_hi, cfg_.table_seed);
}

}  // namespace kvs
