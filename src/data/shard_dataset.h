// A dataset over pre-tokenized token shards (see shards.h and docs/DATA.md).
//
// The train files (globs expanded and sorted, relative to the config file) form
// one token stream; a sequence is a window of seq_len + 1 consecutive tokens
// (windows may cross file boundaries). Train windows start at multiples of
// seq_len; train index i is window perm_e(i mod n) of epoch e = i / n, where
// perm_e is an affine bijection (a*j + b) mod n with gcd(a, n) = 1 and a, b drawn
// from (seed, e): a fresh shuffle every epoch with O(1) memory. Validation is
// the `val` files, or else the last `val_fraction` of the train stream, read in
// order (index wraps around).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/shards.h"

namespace kvs {

// Expands shard path patterns with glob(3): relative patterns are resolved
// against `config_dir`, each pattern's matches are sorted, pattern order is
// kept. A pattern matching nothing, a match that is not a regular file, and a
// file matched twice (it would be read twice) are errors naming `key`.
// Each pattern's matches are checked against the manifest.json beside them
// (shard_manifest_check.h) unless `check_manifests` is false (a caller that
// opens the dataset right after, which checks them: one warning, not two).
std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns, const std::string& config_dir,
                                            const std::string& key, bool check_manifests = true);

class ShardDataset : public Dataset {
 public:
  ShardDataset(const ShardDataConfig& cfg, int seq_len, int vocab_size, uint64_t seed, const std::string& config_dir);
  // Source `source` of a blend (data.shards.weights): train entry `source`,
  // and val entry `source` when cfg.val has one per source.
  ShardDataset(const ShardDataConfig& cfg, size_t source, int seq_len, int vocab_size, uint64_t seed,
               const std::string& config_dir);
  void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const override;
  uint64_t size(Split split) const override;
  std::string describe() const override;
  std::string content_id(Split split) const override;

  // The train window (its start is window * seq_len in the train stream) that train index `index` reads.
  uint64_t train_window(uint64_t index) const;
  uint64_t tokens(Split split) const;  // tokens in the split's stream

 private:
  // A contiguous range [begin, end) of the concatenation of `files`.
  struct Stream {
    std::vector<std::shared_ptr<ShardFile>> files;
    std::vector<uint64_t> offsets;  // offsets[k] = first global position of files[k]; back() = total
    uint64_t begin = 0, end = 0;
    uint64_t size() const { return end - begin; }
  };
  static Stream open_stream(const std::vector<std::string>& paths);
  // train_key / val_key name the entries in messages ("data.shards.train[1]").
  void open(const std::vector<std::string>& train, const std::string& train_key, const std::vector<std::string>& val,
            const std::string& val_key, double val_fraction, const std::string& config_dir);
  void read_window(const Stream& s, uint64_t start, int32_t* inputs, int32_t* targets) const;

  int seq_len_;
  int vocab_size_;
  uint64_t seed_;
  Stream train_, val_;
  uint64_t n_train_ = 0, n_val_ = 0;  // windows
  size_t n_files_ = 0;
  bool val_from_train_ = false;
  std::string train_content_, val_content_;  // content_id()
};

}  // namespace kvs
