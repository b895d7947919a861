// data.tokenizer, checked when the data is opened (like the shard globs), so a
// config loads on a machine that has not prepared its data yet.
#pragma once
#include <string>

namespace kvs {

// `tokenizer` is relative to `config_dir` unless absolute. Throws a one-line
// kvs::Error starting "data.tokenizer: " if it is not a tokenizer directory or
// its vocab_size exceeds `model_vocab_size`. Returns the resolved path.
std::string check_data_tokenizer(const std::string& tokenizer, int model_vocab_size, const std::string& config_dir);

}  // namespace kvs
