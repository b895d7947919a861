// Token shards blended from several sources (data.shards.weights; docs/DATA.md
// "Blending sources"). Each train entry is a source, a ShardDataset of its own
// (its own windows, epochs and shuffle, its own validation split or files);
// BlendSchedule says which source each index reads and which of its indices.
// Validation blends the sources' validation windows with the same weights.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/blend_schedule.h"
#include "data/shard_dataset.h"

namespace kvs {

// Short names for the sources' patterns, for logs and metrics: the patterns
// without their common leading directories ("/d/web/*.bin", "/d/code/*.bin"
// -> "web/*.bin", "code/*.bin"); a repeated pattern gets "#<entry>" added.
std::vector<std::string> source_names(const std::vector<std::string>& patterns);

class BlendedDataset : public Dataset {
 public:
  BlendedDataset(const ShardDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed, const std::string& config_dir);
  void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const override;
  // Train: the sources' windows together. Val: the blend's indices before any
  // source's validation windows would repeat (0 if a source has none).
  uint64_t size(Split split) const override;
  std::string describe() const override;
  std::vector<std::string> source_names() const override { return names_; }
  size_t source_of(Split, uint64_t index) const override { return schedule_.pick(index).source; }
  std::vector<Use> train_use(double sequences) const override;
  std::string content_id(Split split) const override;

  const ShardDataset& source(size_t s) const { return *sources_[s]; }
  const BlendSchedule& schedule() const { return schedule_; }

 private:
  BlendSchedule schedule_;
  std::vector<std::unique_ptr<ShardDataset>> sources_;
  std::vector<std::string> names_;
};

}  // namespace kvs
