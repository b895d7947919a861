// Training a sentencepiece BPE tokenizer the way Llama 2's was trained
// (docs/TOKENIZER.md), into a tokenizer directory written atomically.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // UTF-8 text files; every line is a training sentence
  int vocab_size = 8192;
  std::string out;                  // the tokenizer directory to create
  // Above this many sentences an evenly spaced subset is used (deterministic, no RNG).
  int64_t max_sentences = 2'000'000;
  bool force = false;               // replace an existing `out`
  double character_coverage = 0.99995;  // Llama 2's
  // Non-empty: the inputs are JSON Lines, and the sentences are the lines of
  // each line's string field of this name (jsonl_documents).
  std::string jsonl_key;
};

struct TokenizerTrainResult {
  int64_t sentences_total = 0;  // non-empty lines (after cutting long ones)
  int64_t sentences_used = 0;
  int64_t bytes = 0;            // input bytes
  std::string sha256;           // of tokenizer.model
};

// Throws kvs::Error naming the file on unreadable/non-UTF-8 input or an empty corpus.
TokenizerTrainResult train_tokenizer(const TokenizerTrainOptions& o);

// sentencepiece skips sentences longer than this (Llama 2's value); long lines are cut instead.
inline constexpr size_t kMaxSentenceBytes = 4192;

// The training sentences of `text` (exposed for tests): every non-blank line ('\n' and a trailing '\r' dropped),
// cut into pieces of at most kMaxSentenceBytes just before the last space within the limit (the space starts the
// next piece) or else at a UTF-8 character boundary. Views into `text`.
std::vector<std::string_view> split_sentences(std::string_view text);

}  // namespace kvs
