// kvshift_tokenizer.json: what a tokenizer directory holds, readable without
// loading the model (config validation, export-hf, data prepare's manifest).
//   {"type": "sentencepiece", "model_type": "bpe", "vocab_size": 8192,
//    "bos_id": 1, "eos_id": 2, "unk_id": 0, "pad_id": -1,
//    "sha256": "<sha256 of tokenizer.model>", "trainer": {...}}
// "type": "bytes" (vocab 256, no specials, no tokenizer.model) is accepted too.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kvs {

inline constexpr const char* kTokenizerMetaFile = "kvshift_tokenizer.json";
inline constexpr const char* kTokenizerModelFile = "tokenizer.model";

struct TokenizerMeta {
  std::string type;        // "sentencepiece" | "bytes"
  std::string model_type;  // "bpe" (sentencepiece), "" for bytes
  int vocab_size = 0;
  int bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  std::string sha256;      // of tokenizer.model; "" for bytes
  nlohmann::json trainer;  // the training options, informational (may be null)
};

// Reads DIR/kvshift_tokenizer.json; throws kvs::Error naming the file (and key).
TokenizerMeta read_tokenizer_meta(const std::string& dir);
nlohmann::json tokenizer_meta_json(const TokenizerMeta& m);
// The meta of a sentencepiece model (tokenizer.model's bytes): its piece count,
// special ids and sha256, as `tokenizer train` and `import-hf` write them.
// Throws naming `origin` if the bytes are no sentencepiece model.
TokenizerMeta sentencepiece_meta(const std::string& model_bytes, const std::string& model_type,
                                 const std::string& origin);

}  // namespace kvs
