// Tokenizers: text <-> token ids, behind one interface (docs/TOKENIZER.md).
//   - sentencepiece BPE models trained by `kvshift tokenizer train`: a
//     directory holding tokenizer.model (the sentencepiece model) and
//     kvshift_tokenizer.json (vocab size, special ids, the model's sha256);
//   - the byte-level tokenizer of the built-in byte corpus: ids 0..255 are
//     the bytes themselves, no special tokens.
// A run config names its tokenizer directory in data.tokenizer; a run without
// one (the toy tasks, the byte corpus) has none.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1 if the tokenizer has none
  virtual int eos_id() const = 0;  // -1 if the tokenizer has none
  // No BOS/EOS are added; the caller frames documents.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Long texts in pieces (bounded memory, parallel work): ascending offsets in
  // (0, text.size()) where `text` may be cut, about `max_bytes` apart, such that
  // encode(text) == encode(first piece) ++ encode_after_cut(each later piece).
  // None where the tokenizer cannot guarantee that: the text stays whole.
  virtual std::vector<size_t> safe_cuts(std::string_view text, size_t max_bytes) const = 0;
  // The ids of a piece that starts at one of safe_cuts' offsets.
  virtual std::vector<int32_t> encode_after_cut(std::string_view piece) const = 0;
  // Special tokens decode to nothing. Streaming callers decode the whole
  // prefix and print what is new (a piece may complete a multi-byte character).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The vocabulary entry of `id` for display ("▁The", "<0x0A>", "<s>");
  // by default its decoded text.
  virtual std::string id_to_piece(int32_t id) const { return decode({id}); }
  // One line for logs: "sentencepiece bpe, 8000 pieces (tok/)" / "bytes (256)".
  virtual std::string describe() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// Loads the tokenizer directory `dir`; throws kvs::Error naming the file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

}  // namespace kvs
