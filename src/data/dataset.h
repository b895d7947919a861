// Datasets: a pure function from (split, sequence index) to one training
// sequence. Any process can produce any slice of any batch by index alone,
// which makes resume (store the next index) and data parallelism trivial.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace kvs {

enum class Split { Train, Val };

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Writes sequence `index` of `split`: inputs[seq_len], targets[seq_len]
  // (targets[t] is the token after inputs[t]) and mask[seq_len] (1 = scored, 0 = not).
  // Throws kvs::Error if the data holds a token id >= vocab_size (naming file and position).
  virtual void get(Split split, uint64_t index, int32_t* inputs, int32_t* targets, float* mask) const = 0;
  // Number of distinct sequences in a split (UINT64_MAX for generated tasks).
  virtual uint64_t size(Split split) const = 0;
  // One line for logs: "induction: tokens [11, 8000), pool 512" / "shards: 3 files, 1.2M train tokens".
  virtual std::string describe() const = 0;
  // True for the generated tasks (induction, ngram, hopk): evaluation reports the
  // argmax accuracy on the scored positions under accuracy_name().
  virtual bool reports_accuracy() const { return false; }
  // What the accuracy measures, for logs: "induction" / "3-gram" / "hop-k" / "next-token".
  virtual std::string accuracy_name() const { return "next-token"; }

  // Data blended from several sources (data.shards.weights): their names, and
  // the source each sequence comes from. A single source has no names.
  virtual std::vector<std::string> source_names() const { return {}; }
  virtual size_t source_of(Split, uint64_t) const { return 0; }
  // What reading `sequences` training sequences takes from each source: its
  // name ("" for a single one), its distinct sequences (size(Train)) and how
  // many sequences are read from it.
  struct Use {
    std::string source;
    uint64_t sequences;
    double reads;
  };
  virtual std::vector<Use> train_use(double sequences) const { return {{"", size(Split::Train), sequences}}; }

  // What a split is made of, as a hash a resume compares with the
  // checkpoint's (trainer_state.json "data_contents"): for shards, the files'
  // contents as their manifests record them and the range read; "" for the
  // generated tasks (their settings are compared instead).
  virtual std::string content_id(Split) const { return ""; }
};

// Builds the dataset of a config. `config_dir` resolves relative shard paths;
// `document_bos` (document_bos_of) is checked against data.tokenizer's BOS.
std::unique_ptr<Dataset> make_dataset(const DataConfig& cfg, int seq_len, int vocab_size, uint64_t seed,
                                      const std::string& config_dir, int document_bos = -1);

// The token the model splits documents at: bos_token_id where
// model.document_boundaries is not "none", else -1.
inline int document_bos_of(const ModelConfig& m) {
  return m.document_boundaries != DocumentBoundaries::None ? m.bos_token_id : -1;
}

}  // namespace kvs
