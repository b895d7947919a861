// data.tokenizer, checked when the data is opened (like the shard globs), so a
// config loads on a machine that has not prepared its data yet.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvs {

// `tokenizer` is relative to `config_dir` unless absolute. Throws a one-line
// kvs::Error starting "data.tokenizer: " if it is not a tokenizer directory or
// its vocab_size exceeds `model_vocab_size`, or if `document_bos` (the model's
// bos_token_id where model.document_boundaries splits documents at it, else
// -1) is not the tokenizer's BOS. Returns the resolved path.
std::string check_data_tokenizer(const std::string& tokenizer, int model_vocab_size, const std::string& config_dir,
                                 int document_bos = -1);

// The shards were made with that tokenizer: each directory holding one of
// `shard_files` whose manifest.json (`kvshift data prepare`) records a
// tokenizer sha256 must record the one of `tokenizer_dir` (a checked path).
// Otherwise a tokenizer retrained in place (`--force`) would leave the model
// training on ids that mean other pieces to the tokenizer it is exported and
// sampled with. Directories without a manifest (hand-made shards) are not checked.
void check_shards_tokenizer(const std::vector<std::string>& shard_files, const std::string& tokenizer_dir);

// sha256 of `tokenizer_dir`'s tokenizer.model, the tokenizer's identity; ""
// for the byte-level tokenizer (it has no model file, and no other bytes
// tokenizer means anything else).
std::string tokenizer_sha256(const std::string& tokenizer_dir);

// A checkpoint records the tokenizer it was trained with (trainer_state.json
// "tokenizer_sha256"). Sampling, exporting, evaluating or training on with
// another one would read its ids as other pieces, silently: this throws a
// one-line error naming both when `tokenizer_dir` is not that tokenizer.
// Checkpoints without the key (older ones, or trained without
// data.tokenizer) are not checked.
void check_checkpoint_tokenizer(const nlohmann::json& trainer_state, const std::string& checkpoint_dir,
                                const std::string& tokenizer_dir);

}  // namespace kvs
