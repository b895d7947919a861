#include "cli/commands/text_stream.h"

#include <algorithm>

namespace kvs::cli {

size_t stable_utf8_length(const std::string& s) {
  size_t n = s.size();
  for (;;) {
    // Trailing U+FFFD (EF BF BD): the decoder's placeholder for bytes that may still complete.
    if (n >= 3 && static_cast<unsigned char>(s[n - 3]) == 0xEF && static_cast<unsigned char>(s[n - 2]) == 0xBF &&
        static_cast<unsigned char>(s[n - 1]) == 0xBD) {
      n -= 3;
      continue;
    }
    // A lead byte near the end with fewer continuation bytes than it announces.
    size_t i = n;
    while (i > 0 && n - i < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
    if (i == 0 || n - i >= 4) return n;  // no lead byte in reach: nothing to wait for
    const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return n - (i - 1) < need ? i - 1 : n;
  }
}

// An incomplete character at the end of `shown` is printed whole once it completes.
TextStream::TextStream(const std::string& shown) : shown_(shown.substr(0, stable_utf8_length(shown))) {}

std::string TextStream::update(const std::string& full) {
  const size_t n = stable_utf8_length(full);
  // Only text that extends what is shown can be printed; a decoder that
  // rewrote earlier text waits for finish().
  if (n <= shown_.size() || full.compare(0, shown_.size(), shown_) != 0) return "";
  std::string out = full.substr(shown_.size(), n - shown_.size());
  shown_ = full.substr(0, n);
  return out;
}

std::string TextStream::finish(const std::string& full) {
  // If the decoder rewrote shown text, what is on the screen stays; print past its length.
  std::string out = full.substr(std::min(full.size(), shown_.size()));
  shown_ = full;
  return out;
}

}  // namespace kvs::cli
