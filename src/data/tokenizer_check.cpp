#include "data/tokenizer_check.h"

#include <filesystem>

#include "core/error.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {

std::string check_data_tokenizer(const std::string& tokenizer, int model_vocab_size, const std::string& config_dir) {
  namespace fs = std::filesystem;
  fs::path p(tokenizer);
  if (p.is_relative()) p = fs::path(config_dir) / p;
  p = p.lexically_normal();
  if (!fs::is_directory(p))
    fail("data.tokenizer: {} is not a directory (make one with `kvshift tokenizer train`)", p.string());
  TokenizerMeta meta;
  try {
    meta = read_tokenizer_meta(p.string());
  } catch (const Error& e) {
    fail("data.tokenizer: {}", e.what());
  }
  if (meta.vocab_size > model_vocab_size)
    fail("data.tokenizer: the tokenizer's vocab_size {} exceeds model.vocab_size {} ({})", meta.vocab_size,
         model_vocab_size, p.string());
  return p.string();
}

}  // namespace kvs
