// The byte-level tokenizer of the built-in byte corpus: id = byte value.
#include <memory>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace kvs {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  int vocab_size() const override { return 256; }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  // Every byte is its own id: any offset is a cut.
  std::vector<size_t> safe_cuts(std::string_view text, size_t max_bytes) const override {
    std::vector<size_t> cuts;
    for (size_t at = max_bytes; max_bytes > 0 && at < text.size(); at += max_bytes) cuts.push_back(at);
    return cuts;
  }
  std::vector<int32_t> encode_after_cut(std::string_view piece) const override { return encode(piece); }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      KVS_CHECK(ids[i] >= 0 && ids[i] < 256, "byte tokenizer: id {} at position {} is outside [0, 256)", ids[i], i);
      s[i] = static_cast<char>(ids[i]);
    }
    return s;
  }
  std::string describe() const override { return "bytes (256)"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace kvs
