// make_dataset: the dataset a config's `data.type` names.
#include "data/dataset.h"

#include "core/error.h"
#include "data/blended_dataset.h"
#include "data/hopk.h"
#include "data/induction.h"
#include "data/ngram.h"
#include "data/shard_dataset.h"
#include "data/tokenizer_check.h"

namespace kvs {

std::unique_ptr<Dataset> make_dataset(const DataConfig& cfg, int seq_len, int vocab_size, uint64_t seed,
                                      const std::string& config_dir, int document_bos) {
  if (!cfg.tokenizer.empty()) {
    const std::string tokenizer = check_data_tokenizer(cfg.tokenizer, vocab_size, config_dir, document_bos);
    if (cfg.type == DatasetType::Shards) {
      // The datasets below check the shards against their manifests (and a
      // stream's files for one read twice). Each entry apart: blended sources
      // may share files (a subset weighted up).
      std::vector<std::string> files;
      for (const auto& [list, key] : {std::pair{&cfg.shards.train, "data.shards.train"},
                                      std::pair{&cfg.shards.val, "data.shards.val"}})
        for (const std::string& entry : *list) {
          const std::vector<std::string> f = expand_shard_paths({entry}, config_dir, key, false);
          files.insert(files.end(), f.begin(), f.end());
        }  // every source's files, blended or not
      check_shards_tokenizer(files, tokenizer);
    }
  }
  switch (cfg.type) {
    case DatasetType::Induction: return std::make_unique<InductionDataset>(cfg.induction, seq_len, vocab_size, seed);
    case DatasetType::Ngram: return std::make_unique<NgramDataset>(cfg.ngram, seq_len, vocab_size, seed);
    case DatasetType::Hopk: return std::make_unique<HopkDataset>(cfg.hopk, seq_len, vocab_size, seed);
    case DatasetType::Shards:
      if (!cfg.shards.weights.empty())
        return std::make_unique<BlendedDataset>(cfg.shards, seq_len, vocab_size, seed, config_dir);
      return std::make_unique<ShardDataset>(cfg.shards, seq_len, vocab_size, seed, config_dir);
  }
  fail("data.type: {} is not a dataset type", static_cast<int>(cfg.type));  // only a cast integer gets here
}

}  // namespace kvs
