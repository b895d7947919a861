// Blended shards: an index goes to its source through the schedule.
#include "data/blended_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/sha256.h"

namespace kvs {

std::vector<std::string> source_names(const std::vector<std::string>& patterns) {
  // The longest directory prefix ("a/b/") that every pattern shares.
  size_t common = 0;
  if (patterns.size() > 1) {
    const std::string& first = patterns[0];
    for (size_t i = 0; i < first.size(); ++i) {
      const bool shared = std::all_of(patterns.begin(), patterns.end(),
                                      [&](const std::string& p) { return i < p.size() && p[i] == first[i]; });
      if (!shared) break;
      if (first[i] == '/') common = i + 1;
    }
  }
  std::vector<std::string> names;
  for (size_t s = 0; s < patterns.size(); ++s) {
    std::string name = patterns[s].substr(common);
    if (std::count(patterns.begin(), patterns.end(), patterns[s]) > 1) name += fmt::format("#{}", s);
    names.push_back(name);
  }
  return names;
}

BlendedDataset::BlendedDataset(const ShardDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed,
                               const std::string& config_dir)
    : schedule_(cfg.weights, "data.shards.weights"), names_(kvs::source_names(cfg.train)) {
  KVS_CHECK(cfg.weights.size() == cfg.train.size(), "data.shards.weights: {} weights for {} data.shards.train entries",
            cfg.weights.size(), cfg.train.size());
  // Every source shuffles with the run's seed: their window counts differ, and
  // so do their orders; one source with weight 1 reads what no weights read.
  for (size_t s = 0; s < cfg.train.size(); ++s)
    sources_.push_back(std::make_unique<ShardDataset>(cfg, s, seq_len, vocab_size, seed, config_dir));
}

void BlendedDataset::get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const {
  const BlendSchedule::Pick p = schedule_.pick(index);
  if (split == Split::Val)
    KVS_CHECK(sources_[p.source]->size(Split::Val) > 0,
              "shards: no validation data for source {} ({}): data.shards.val is empty and data.shards.val_fraction "
              "is 0",
              p.source, names_[p.source]);
  sources_[p.source]->get(split, p.index, inputs, targets, mask);
}

uint64_t BlendedDataset::size(Split split) const {
  uint64_t n = split == Split::Train ? 0 : std::numeric_limits<uint64_t>::max();
  for (size_t s = 0; s < sources_.size(); ++s) {
    const uint64_t own = sources_[s]->size(split);
    n = split == Split::Train ? n + own : std::min(n, own == 0 ? 0 : schedule_.position(s, own));
  }
  return n;
}

std::string BlendedDataset::describe() const {
  std::string s = fmt::format("blend of {} sources", sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i)
    s += fmt::format("{} {} {:.4g}% ({})", i ? ";" : ":", names_[i], 100 * schedule_.share(i), sources_[i]->describe());
  return s;
}

std::string BlendedDataset::content_id(Split split) const {
  Sha256 h;  // the sources' in order (their shares are in the recorded counts)
  for (const auto& source : sources_) h.update(source->content_id(split) + "\n");
  return h.hex();
}

std::vector<Dataset::Use> BlendedDataset::train_use(double sequences) const {
  std::vector<Use> uses;
  for (size_t s = 0; s < sources_.size(); ++s)
    uses.push_back({names_[s], sources_[s]->size(Split::Train), sequences * schedule_.share(s)});
  return uses;
}

}  // namespace kvs
