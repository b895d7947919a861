// sentencepiece models behind kvs::Tokenizer, and load_tokenizer for a
// tokenizer directory (tokenizer.model + kvshift_tokenizer.json).
#include <sentencepiece_processor.h>

#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& dir, const TokenizerMeta& meta) : dir_(dir), meta_(meta) {
    const std::string model = (std::filesystem::path(dir) / kTokenizerModelFile).string();
    const std::string meta_file = (std::filesystem::path(dir) / kTokenizerMetaFile).string();
    const std::string bytes = read_file(model);
    // The hash ties the model to the shards prepared with it (their manifest records it).
    const std::string sha = sha256_hex(bytes);
    KVS_CHECK(sha == meta.sha256, "{}: sha256 {} does not match 'sha256' {} in {} (model replaced or corrupt)", model,
              sha, meta.sha256, meta_file);
    const auto st = sp_.LoadFromSerializedProto(bytes);
    KVS_CHECK(st.ok(), "{}: not a sentencepiece model: {}", model, st.ToString());
    KVS_CHECK(sp_.GetPieceSize() == meta.vocab_size, "{}: the model has {} pieces but 'vocab_size' in {} is {}", model,
              sp_.GetPieceSize(), meta_file, meta.vocab_size);
    KVS_CHECK(sp_.bos_id() == meta.bos_id && sp_.eos_id() == meta.eos_id && sp_.unk_id() == meta.unk_id &&
                  sp_.pad_id() == meta.pad_id,
              "{}: special ids (bos {}, eos {}, unk {}, pad {}) differ from {} (bos {}, eos {}, unk {}, pad {})", model,
              sp_.bos_id(), sp_.eos_id(), sp_.unk_id(), sp_.pad_id(), meta_file, meta.bos_id, meta.eos_id,
              meta.unk_id, meta.pad_id);
  }
  int vocab_size() const override { return meta_.vocab_size; }
  int bos_id() const override { return meta_.bos_id; }
  int eos_id() const override { return meta_.eos_id; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    KVS_CHECK(st.ok(), "{}: sentencepiece cannot encode: {}", dir_, st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    for (size_t i = 0; i < ids.size(); ++i)
      KVS_CHECK(ids[i] >= 0 && ids[i] < meta_.vocab_size, "{}: id {} at position {} is outside [0, {})", dir_, ids[i],
                i, meta_.vocab_size);
    std::string out;
    const auto st = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
    KVS_CHECK(st.ok(), "{}: sentencepiece cannot decode: {}", dir_, st.ToString());
    return out;
  }
  std::string id_to_piece(int32_t id) const override {
    KVS_CHECK(id >= 0 && id < meta_.vocab_size, "{}: id {} is outside [0, {})", dir_, id, meta_.vocab_size);
    return sp_.IdToPiece(id);
  }
  std::string describe() const override {
    return "sentencepiece " + meta_.model_type + ", " + std::to_string(meta_.vocab_size) + " pieces (" + dir_ + ")";
  }

 private:
  std::string dir_;
  TokenizerMeta meta_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const TokenizerMeta meta = read_tokenizer_meta(dir);
  if (meta.type == "bytes") return make_byte_tokenizer();
  return std::make_unique<SentencePieceTokenizer>(dir, meta);
}

}  // namespace kvs
