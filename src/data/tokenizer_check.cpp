#include "data/tokenizer_check.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/sha256.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs {

std::string check_data_tokenizer(const std::string& tokenizer, int model_vocab_size, const std::string& config_dir,
                                 int document_bos) {
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
  if (document_bos >= 0 && meta.bos_id < 0)
    fail("model.bos_token_id ({}): data.tokenizer {} has no BOS token (byte-level data is not framed in documents): "
         "model.document_boundaries needs \"none\" with it",
         document_bos, p.string());
  if (document_bos >= 0 && meta.bos_id != document_bos)
    fail("model.bos_token_id ({}) is not the BOS of data.tokenizer {} ({}): model.document_boundaries would split "
         "documents at another token",
         document_bos, p.string(), meta.bos_id);
  return p.string();
}

namespace {

// "bytes" or "sentencepiece (sha256 0123456789ab...)": what a manifest or a
// tokenizer directory says the ids mean (an older manifest without "type":
// no sha256 is the byte tokenizer's).
std::string tokenizer_identity(const std::string& type, const std::string& sha256) {
  if (type == "bytes" || (type.empty() && sha256.empty())) return "bytes";
  return fmt::format("{} (sha256 {}...)", type.empty() ? "sentencepiece" : type, sha256.substr(0, 12));
}

}  // namespace

void check_shards_tokenizer(const std::vector<std::string>& shard_files, const std::string& tokenizer_dir) {
  namespace fs = std::filesystem;
  const TokenizerMeta meta = read_tokenizer_meta(tokenizer_dir);
  const std::string want = tokenizer_identity(meta.type, meta.sha256);
  std::set<std::string> dirs;
  for (const std::string& f : shard_files) dirs.insert(fs::path(f).parent_path().lexically_normal().string());
  for (const std::string& d : dirs) {
    const std::string manifest = (fs::path(d) / "manifest.json").string();
    if (!fs::exists(manifest)) continue;
    const nlohmann::json m = read_json_file(manifest);
    const auto tok = m.find("tokenizer");
    if (tok == m.end() || !tok->is_object() || !tok->contains("sha256") || !(*tok)["sha256"].is_string()) continue;
    const auto type = tok->find("type");
    const std::string have =
        tokenizer_identity(type != tok->end() && type->is_string() ? type->get<std::string>() : "", (*tok)["sha256"]);
    if (have == want) continue;
    fail("{}: the shards were made with another tokenizer ({}, {}) than data.tokenizer {} ({}): run `kvshift data "
         "prepare` again with it, or point data.tokenizer at the one they were made with",
         manifest, have, tok->value("dir", std::string("directory not recorded")), tokenizer_dir, want);
  }
}

std::string tokenizer_sha256(const std::string& tokenizer_dir) {
  const std::string model = (std::filesystem::path(tokenizer_dir) / "tokenizer.model").string();
  return std::filesystem::exists(model) ? sha256_file(model) : "";
}

void check_checkpoint_tokenizer(const nlohmann::json& trainer_state, const std::string& checkpoint_dir,
                                const std::string& tokenizer_dir) {
  if (!trainer_state.is_object()) return;
  const auto it = trainer_state.find("tokenizer_sha256");
  if (it == trainer_state.end() || !it->is_string() || it->get<std::string>().empty()) return;
  const std::string want = it->get<std::string>(), have = tokenizer_sha256(tokenizer_dir);
  if (have == want) return;
  fail("{}: not the tokenizer checkpoint {} was trained with (its tokenizer.model sha256 is {}, the checkpoint's "
       "trainer_state.json records {}...): its ids would mean other pieces; use the tokenizer the model was trained "
       "with",
       tokenizer_dir, checkpoint_dir, have.empty() ? "none: byte-level" : have.substr(0, 12) + "...",
       want.substr(0, 12));
}

}  // namespace kvs
