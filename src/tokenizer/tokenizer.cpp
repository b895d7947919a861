// What every tokenizer shares, on top of its own encode and safe_cuts.
#include "tokenizer/tokenizer.h"

namespace kvs {

std::vector<int32_t> encode_in_pieces(const Tokenizer& tok, std::string_view text, size_t max_bytes) {
  const std::vector<size_t> cuts = tok.safe_cuts(text, max_bytes);
  std::vector<int32_t> ids;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t begin = i == 0 ? 0 : cuts[i - 1], end = i == cuts.size() ? text.size() : cuts[i];
    const std::string_view piece = text.substr(begin, end - begin);
    const auto part = i == 0 ? tok.encode(piece) : tok.encode_after_cut(piece);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

}  // namespace kvs
