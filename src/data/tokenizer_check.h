// data.tokenizer, checked when the data is opened (like the shard globs), so a
// config loads on a machine that has not prepared its data yet.
#pragma once
#include <string>
#include <vector>

namespace kvs {

// `tokenizer` is relative to `config_dir` unless absolute. Throws a one-line
// kvs::Error starting "data.tokenizer: " if it is not a tokenizer directory or
// its vocab_size exceeds `model_vocab_size`. Returns the resolved path.
std::string check_data_tokenizer(const std::string& tokenizer, int model_vocab_size, const std::string& config_dir);

// The shards were made with that tokenizer: each directory holding one of
// `shard_files` whose manifest.json (`kvshift data prepare`) records a
// tokenizer sha256 must record the one of `tokenizer_dir` (a checked path).
// Otherwise a tokenizer retrained in place (`--force`) would leave the model
// training on ids that mean other pieces to the tokenizer it is exported and
// sampled with. Directories without a manifest (hand-made shards) are not checked.
void check_shards_tokenizer(const std::vector<std::string>& shard_files, const std::string& tokenizer_dir);

}  // namespace kvs
