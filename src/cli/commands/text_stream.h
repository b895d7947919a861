// Streaming decoded text. Tokens can end inside a UTF-8 character (byte
// tokens, sentencepiece byte fallback), so the caller decodes the whole
// sequence after each token and this prints only the new, complete suffix.
#pragma once
#include <string>

namespace kvs::cli {

class TextStream {
 public:
  // `shown`: text not to print (the prompt's decode); a character it leaves
  // incomplete is printed whole once the generated tokens complete it.
  explicit TextStream(const std::string& shown);
  // The decode of the whole sequence so far -> what to print now: the new
  // text, minus a trailing incomplete UTF-8 character or U+FFFD (a
  // sentencepiece decoder's stand-in for bytes that may still complete).
  std::string update(const std::string& full);
  // At the end: everything not printed yet, incomplete tail included.
  std::string finish(const std::string& full);

 private:
  std::string shown_;
};

// Length of `s` without a trailing incomplete UTF-8 sequence or trailing U+FFFD.
size_t stable_utf8_length(const std::string& s);

}  // namespace kvs::cli
