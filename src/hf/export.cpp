#include "hf/export.h"

#include <cmath>
#include <filesystem>
#include <utility>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "hf/hf_config.h"
#include "hf/shard_plan.h"
#include "tokenizer/sp_model.h"
#include "hf/tokenizer_json.h"
#include "hf/staged_dir.h"
#include "hf_python_files.h"  // generated from python/hf/*.py (cmake/EmbedFiles.cmake)
#include "model/params.h"
#include "data/tokenizer_check.h"
#include "train/model_io.h"

namespace kvs::hf {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {


// The tokenizer directory to export: --tokenizer, else run_config.data.tokenizer
// (as written there: absolute, or relative to the current directory), else the
// checkpoint's own tokenizer/ (import-hf's). "" with
// `why` set when there is none to export.
std::string find_tokenizer_dir(const ExportOptions& o, const std::string& checkpoint_dir, const json& run_config,
                               const std::string& run_config_error, std::string& why) {
  std::string dir = o.tokenizer, origin = "--tokenizer";
  if (dir.empty()) {
    KVS_CHECK(run_config_error.empty(), "{} (it names the tokenizer to export; fix it or pass --tokenizer DIR)",
              run_config_error);
    const json* d = run_config.is_object() && run_config.contains("data") ? &run_config["data"] : nullptr;
    if (!d || !d->is_object() || !d->contains("tokenizer") || !(*d)["tokenizer"].is_string()) {
      if (fs::exists(checkpoint_dir + "/tokenizer/kvshift_tokenizer.json"))  // import-hf's copy
        return checkpoint_dir + "/tokenizer";
      why = "the run config names none, the checkpoint has no tokenizer/ and --tokenizer is not given";
      return "";
    }
    dir = (*d)["tokenizer"].get<std::string>();
    origin = o.checkpoint + "/run_config.json: data.tokenizer";
  }
  const std::string meta = dir + "/kvshift_tokenizer.json";
  if (fs::exists(meta)) {
    const json m = read_json_file(meta);
    if (m.is_object() && m.value("type", "") == "bytes") {
      why = "the byte-level tokenizer (" + dir + ") has no Hugging Face counterpart";
      return "";
    }
  }
  KVS_CHECK(fs::exists(dir + "/tokenizer.model"), "{} '{}': no tokenizer.model there{}", origin, dir,
            o.tokenizer.empty() ? " (pass --tokenizer DIR)" : "");
  return dir;
}

struct TokenizerInfo {
  SpecialIds ids;
  int size = 0;  // ids [0, size) are the tokenizer's (0: no tokenizer)
  SpModel model;
  const std::string& piece(int id) const { return model.pieces[id].piece; }
};

TokenizerInfo read_tokenizer(const std::string& dir, int model_vocab) {
  const std::string meta_path = dir + "/kvshift_tokenizer.json";
  const std::string model_path = dir + "/tokenizer.model";
  KVS_CHECK(fs::exists(model_path), "{}: missing tokenizer.model (not a tokenizer directory?)", dir);
  TokenizerInfo t;
  t.model = read_sentencepiece_model(model_path);
  int vocab = static_cast<int>(t.model.pieces.size());
  if (fs::exists(meta_path)) {
    const json m = read_json_file(meta_path);
    auto id = [&](const char* key) {
      KVS_CHECK(!m.contains(key) || m[key].is_number_integer(), "{}: {} must be an integer", meta_path, key);
      return m.value(key, -1);
    };
    t.ids = {id("bos_id"), id("eos_id"), id("pad_id"), id("unk_id")};
    vocab = m.value("vocab_size", vocab);
  } else {
    t.ids = {1, 2, -1, 0};  // sentencepiece's defaults
    spdlog::warn("{}: no kvshift_tokenizer.json; assuming sentencepiece's ids (unk 0, bos 1, eos 2)", dir);
  }
  KVS_CHECK(vocab <= model_vocab, "{}: the tokenizer has {} pieces but the model's vocab_size is {}", dir, vocab,
            model_vocab);
  t.size = vocab;
  for (int id : {t.ids.bos, t.ids.eos, t.ids.pad, t.ids.unk})
    KVS_CHECK(id < static_cast<int>(t.model.pieces.size()), "{}: special id {} is beyond the model's {} pieces", dir,
              id, t.model.pieces.size());
  return t;
}

// With tokenizer.json a PreTrainedTokenizerFast reads it; without, a LlamaTokenizer converts
// tokenizer.model (why_not_json: why_no_tokenizer_json's reason, "" when there is one).
const char* tokenizer_class(const std::string& why_not_json) {
  return why_not_json.empty() ? "PreTrainedTokenizerFast" : "LlamaTokenizer";
}

// tokenizer.json when why_not_json is "", tokenizer.model, tokenizer_config.json, special_tokens_map.json.
void write_tokenizer_files(const StagedDir& out, const std::string& dir, const TokenizerInfo& t, int max_len,
                           const std::string& why_not_json) {
  fs::copy_file(dir + "/tokenizer.model", out.file("tokenizer.model"));
  auto piece = [&](int id) { return id >= 0 ? json(t.piece(id)) : json(nullptr); };
  json special = json::object();
  for (auto [key, id] : {std::pair{"bos_token", t.ids.bos}, {"eos_token", t.ids.eos}, {"unk_token", t.ids.unk},
                         {"pad_token", t.ids.pad}})
    if (id >= 0) special[key] = t.piece(id);
  // With tokenizer.json (tokenizer_json.h says why) transformers 4.x and 5.x encode
  // as sentencepiece does. Without it, a LlamaTokenizer converts tokenizer.model
  // itself: sentencepiece's ids on 4.x with `legacy`, but 5.x drops the dummy
  // prefix before a leading space. "<s>" / "</s>" in a text are text, not the
  // special tokens, as in kvshift's data. Checked by tests/hf/run_hf.py.
  if (why_not_json.empty())
    write_json_file(out.file("tokenizer.json"), tokenizer_json(t.model, t.ids.bos));
  json cfg = {{"tokenizer_class", tokenizer_class(why_not_json)},
              {"add_bos_token", t.ids.bos >= 0},
              {"add_eos_token", false},
              {"bos_token", piece(t.ids.bos)},
              {"eos_token", piece(t.ids.eos)},
              {"unk_token", piece(t.ids.unk)},
              {"pad_token", piece(t.ids.pad)},
              {"model_max_length", max_len},
              // What the model takes: without it transformers 4.x's PreTrainedTokenizerFast also
              // returns token_type_ids, which generate(**ids) and a LlamaForCausalLM refuse.
              {"model_input_names", json::array({"input_ids", "attention_mask"})},
              {"padding_side", "left"},  // as LlamaTokenizer's
              {"clean_up_tokenization_spaces", false},
              {"legacy", true},
              {"split_special_tokens", true},
              {"sp_model_kwargs", json::object()}};
  write_json_file(out.file("tokenizer_config.json"), cfg);
  write_json_file(out.file("special_tokens_map.json"), special);
}

// The weights in the export's dtype, read from the checkpoint a tensor at a
// time: the export holds them once (half the fp32 size in bf16), not also the
// checkpoint's copy.
std::vector<StTensor> converted_tensors(const OpenedCheckpoint& ck, bool bf16) {
  std::vector<StTensor> out;  // our layout order: embeddings, layer by layer, norm, lm_head
  read_model_weights(
      ck,
      [&](const ParamTensor& t, const float* v) {
        out.push_back(bf16 ? make_bf16_tensor(t.name, t.shape, v) : make_f32_tensor(t.name, t.shape, v));
      },
      "refusing to export a broken model");
  return out;
}

// model.safetensors, or shards + model.safetensors.index.json above the limit. Returns the shard count.
// The tensors are moved into the shards (no second copy of the weights).
size_t write_weights(const StagedDir& out, std::vector<StTensor> tensors, uint64_t limit) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}};  // transformers requires it
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const auto& t : tensors) bytes.push_back(t.bytes.size()), total += t.bytes.size();
  const auto shards = plan_shards(bytes, limit);
  if (shards.size() == 1) {
    write_safetensors(out.file("model.safetensors"), tensors, meta);
    return 1;
  }
  json map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<StTensor> part;
    for (size_t i : shards[s]) {
      map[tensors[i].name] = shard_file_name(s, shards.size());
      part.push_back(std::move(tensors[i]));
    }
    write_safetensors(out.file(shard_file_name(s, shards.size())), part, meta);
  }
  write_json_file(out.file("model.safetensors.index.json"),
                  {{"metadata", {{"total_size", total}}}, {"weight_map", map}});
  return shards.size();
}

}  // namespace

std::string export_hf(const ExportOptions& o) {
  KVS_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "--dtype: must be bf16 or fp32, got '{}'", o.dtype);
  const OpenedCheckpoint ck = open_model_checkpoint(o.checkpoint, false);
  const ModelConfig& m = ck.model;
  std::vector<StTensor> tensors = converted_tensors(ck, o.dtype == "bf16");
  const size_t n_tensors = tensors.size();
  uint64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.bytes.size();

  std::string no_tok_reason;
  const std::string tok_dir =
      find_tokenizer_dir(o, ck.dir, ck.files.run_config, ck.files.run_config_error, no_tok_reason);
  TokenizerInfo tok;
  if (!tok_dir.empty()) {
    check_checkpoint_tokenizer(ck.files.trainer_state, o.checkpoint, tok_dir);
    tok = read_tokenizer(tok_dir, m.vocab_size);
  }

  std::vector<std::string> inputs = {o.checkpoint};
  if (!tok_dir.empty()) inputs.push_back(tok_dir);
  StagedDir out(o.out, o.force, inputs);
  const bool remote = needs_remote_code(m);
  const std::string no_json_reason = tok_dir.empty() ? "" : why_no_tokenizer_json(tok.model);
  json config = export_config(m, o.dtype == "bf16" ? "bfloat16" : "float32", tok.ids);
  // Also in config.json: transformers 4.x's pipeline(model=path) looks for the tokenizer there when
  // it does not know the model type (a KV-shift export's kvshift_llama), and otherwise loads none.
  if (!tok_dir.empty()) config["tokenizer_class"] = tokenizer_class(no_json_reason);
  json gen = generation_config(tok.ids, tok.size, m.vocab_size);
  // Without a tokenizer, the EOS an import kept in the checkpoint's config.json
  // (an id or a list, Llama 3's): transformers' generate stops there.
  if (const json& eos = ck.files.hf_config.value("eos_token_id", json()); tok_dir.empty() && !eos.is_null())
    config["eos_token_id"] = gen["eos_token_id"] = eos;
  write_json_file(out.file("config.json"), config);
  write_json_file(out.file("generation_config.json"), gen);
  const size_t n_shards = write_weights(out, std::move(tensors), o.max_shard_bytes);
  if (remote)
    for (const auto& f : kEmbeddedPython) atomic_write_file(out.file(std::string(f.name)), f.text);
  if (!tok_dir.empty()) write_tokenizer_files(out, tok_dir, tok, m.max_position_embeddings, no_json_reason);
  out.commit();
  if (tok_dir.empty())  // after the commit, so that an error stays the only line of a failed run
    spdlog::warn("no tokenizer ({}): wrote no tokenizer files", no_tok_reason);
  else if (!no_json_reason.empty())
    spdlog::warn("{}/tokenizer.model: no tokenizer.json ({}): transformers converts tokenizer.model itself, and its "
                 "ids may differ from sentencepiece's for some texts (docs/HF.md)",
                 tok_dir, no_json_reason);
  if (m.document_boundaries != DocumentBoundaries::None)
    spdlog::warn("model.document_boundaries \"{}\" is a training option the export drops: transformers treats each "
                 "input as one document (the same logits for a sequence with BOS only at its start)",
                 m.document_boundaries);

  return fmt::format("exported {} -> {}: {} tensors, {:.1f} MB {} in {} file{}, {}{}", o.checkpoint, o.out,
                     n_tensors, bytes / 1e6, o.dtype, n_shards, n_shards == 1 ? "" : "s",
                     remote ? "KvShiftLlamaForCausalLM (load with trust_remote_code=True)" : "LlamaForCausalLM",
                     tok_dir.empty() ? ", no tokenizer" : ", tokenizer from " + tok_dir);
}

}  // namespace kvs::hf
