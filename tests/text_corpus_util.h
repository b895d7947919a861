// A small deterministic pseudo-English corpus for the tokenizer and data
// preparation tests (with digits, punctuation and some non-ASCII words), and a
// tokenizer trained on it once per test binary.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "tokenizer/train.h"

namespace kvs::testing_util {

inline std::string corpus_text(int lines, uint64_t seed) {
  static const std::vector<std::string> words = {
      "the",   "attention", "model",  "learns", "to",     "copy",   "tokens", "from",    "earlier", "positions",
      "a",     "shift",     "mixes",  "each",   "key",    "with",   "its",    "previous", "value",  "and",
      "we",    "train",     "on",     "text",   "files",  "café",   "naïve",  "Grüße",   "über",    "Ελληνικά",
      "in",    "layers",    "heads",  "of",     "is",     "for",    "data",   "kernel",  "memory",  "driver"};
  std::string s;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto next = [&](uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return (x >> 33) % n;
  };
  for (int l = 0; l < lines; ++l) {
    const int n = 4 + static_cast<int>(next(10));
    for (int w = 0; w < n; ++w) {
      if (w) s += ' ';
      if (next(12) == 0) s += std::to_string(next(100000));
      else s += words[next(words.size())];
    }
    s += next(3) == 0 ? ",\n" : ".\n";
    if (next(8) == 0) s += '\n';  // paragraph breaks
  }
  return s;
}

// A tokenizer (vocab 500) trained on corpus_text(1500, 1), once per process;
// its directory is removed at exit.
inline const std::string& shared_tokenizer_dir() {
  struct Shared {
    std::filesystem::path base;
    std::string dir;
    Shared() {
      base = std::filesystem::temp_directory_path() / ("kvs_shared_tok_" + std::to_string(::getpid()));
      std::filesystem::remove_all(base);
      std::filesystem::create_directories(base);
      spit((base / "train.txt").string(), corpus_text(1500, 1));
      TokenizerTrainOptions o;
      o.inputs = {(base / "train.txt").string()};
      o.vocab_size = 500;
      o.out = (base / "tok").string();
      train_tokenizer(o);
      dir = o.out;
    }
    ~Shared() {
      std::error_code ec;
      std::filesystem::remove_all(base, ec);
    }
  };
  static const Shared shared;
  return shared.dir;
}

}  // namespace kvs::testing_util
