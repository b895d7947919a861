#include "tokenizer/tokenizer_meta.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/sha256.h"

namespace kvs {
namespace {

int int_key(const nlohmann::json& j, const std::string& file, const char* key) {
  KVS_CHECK(j.contains(key), "{}: missing key '{}'", file, key);
  KVS_CHECK(j[key].is_number_integer(), "{}: '{}' must be an integer", file, key);
  return j[key].get<int>();
}

std::string str_key(const nlohmann::json& j, const std::string& file, const char* key) {
  KVS_CHECK(j.contains(key), "{}: missing key '{}'", file, key);
  KVS_CHECK(j[key].is_string(), "{}: '{}' must be a string", file, key);
  return j[key].get<std::string>();
}

}  // namespace

TokenizerMeta read_tokenizer_meta(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / kTokenizerMetaFile).string();
  KVS_CHECK(std::filesystem::is_directory(dir), "{}: not a tokenizer directory (does not exist or is not a directory)",
            dir);
  KVS_CHECK(std::filesystem::exists(file), "{}: missing; a tokenizer directory is made by `kvshift tokenizer train`",
            file);
  const nlohmann::json j = read_json_file(file);
  KVS_CHECK(j.is_object(), "{}: must be a JSON object", file);
  TokenizerMeta m;
  m.type = str_key(j, file, "type");
  if (m.type == "bytes") {
    m.vocab_size = 256;
    return m;
  }
  KVS_CHECK(m.type == "sentencepiece", "{}: 'type' must be \"sentencepiece\" or \"bytes\" (got \"{}\")", file, m.type);
  m.model_type = str_key(j, file, "model_type");
  m.vocab_size = int_key(j, file, "vocab_size");
  KVS_CHECK(m.vocab_size > 0, "{}: 'vocab_size' must be positive (got {})", file, m.vocab_size);
  m.bos_id = int_key(j, file, "bos_id");
  m.eos_id = int_key(j, file, "eos_id");
  m.unk_id = int_key(j, file, "unk_id");
  m.pad_id = int_key(j, file, "pad_id");
  for (auto [key, id] : {std::pair{"bos_id", m.bos_id}, {"eos_id", m.eos_id}, {"unk_id", m.unk_id}, {"pad_id", m.pad_id}})
    KVS_CHECK(id >= -1 && id < m.vocab_size, "{}: '{}' {} is outside [-1, vocab_size {})", file, key, id, m.vocab_size);
  m.sha256 = str_key(j, file, "sha256");
  if (j.contains("trainer")) m.trainer = j["trainer"];
  return m;
}

nlohmann::json tokenizer_meta_json(const TokenizerMeta& m) {
  if (m.type == "bytes") return {{"type", "bytes"}, {"vocab_size", 256}};
  nlohmann::json j = {{"type", m.type},     {"model_type", m.model_type}, {"vocab_size", m.vocab_size},
                      {"bos_id", m.bos_id}, {"eos_id", m.eos_id},         {"unk_id", m.unk_id},
                      {"pad_id", m.pad_id}, {"sha256", m.sha256}};
  if (!m.trainer.is_null()) j["trainer"] = m.trainer;
  return j;
}

TokenizerMeta sentencepiece_meta(const std::string& model_bytes, const std::string& model_type,
                                 const std::string& origin) {
  sentencepiece::SentencePieceProcessor sp;
  const auto st = sp.LoadFromSerializedProto(model_bytes);
  KVS_CHECK(st.ok(), "{}: not a sentencepiece model: {}", origin, st.ToString());
  TokenizerMeta m;
  m.type = "sentencepiece";
  m.model_type = model_type;
  m.vocab_size = sp.GetPieceSize();
  m.bos_id = sp.bos_id();
  m.eos_id = sp.eos_id();
  m.unk_id = sp.unk_id();
  m.pad_id = sp.pad_id();
  m.sha256 = sha256_hex(model_bytes);
  return m;
}

}  // namespace kvs
