#include "hf/import.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "hf/hf_config.h"
#include "tokenizer/sp_model.h"
#include "hf/staged_dir.h"
#include "model/params.h"
#include "tokenizer/tokenizer_meta.h"

namespace kvs::hf {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json read_json(const std::string& path) {
  KVS_CHECK(fs::exists(path), "{}: missing (not a Hugging Face model directory?)", path);
  return read_json_file(path);
}

struct Located {
  std::string file;
  StTensor tensor;
};

// Every tensor of model.safetensors, or of the shards an index names.
std::map<std::string, Located> read_weights(const std::string& dir) {
  std::vector<std::string> files;
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back(single);
  } else if (fs::exists(index)) {
    const json j = read_json(index);
    KVS_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "{}: no weight_map object", index);
    std::set<std::string> seen;
    for (const auto& [name, f] : j["weight_map"].items()) {
      KVS_CHECK(f.is_string(), "{}: weight_map['{}'] is not a file name", index, name);
      if (seen.insert(f.get<std::string>()).second) files.push_back(dir + "/" + f.get<std::string>());
    }
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are supported)",
         dir);
  }
  std::map<std::string, Located> out;
  for (const auto& f : files) {
    KVS_CHECK(fs::exists(f), "{}: missing (named by model.safetensors.index.json)", f);
    for (auto& t : read_safetensors(f)) {
      KVS_CHECK(!out.count(t.name), "{}: tensor '{}' also appears in {}", f, t.name, out[t.name].file);
      std::string name = t.name;
      out[name] = Located{f, std::move(t)};
    }
  }
  return out;
}

// Buffers Hugging Face once saved beside the weights; they are not parameters.
bool ignorable(const std::string& name, const ModelConfig& m) {
  if (name.find("rotary_emb.inv_freq") != std::string::npos) return true;
  return m.tie_word_embeddings && name == "lm_head.weight";  // some tied checkpoints still store it
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Adds shift tensors to a model without them: "paper" = init_params' rule, "identity" = prev 0, cur 1.
void add_shift(const ImportOptions& o, ModelConfig& m) {
  KVS_CHECK(o.window >= 1 && o.window <= 3, "--window: must be 1, 2 or 3 (the windows training supports), got {}",
            o.window);
  m.kv_shift = KvShiftConfig{};
  m.kv_shift.enabled = true;
  m.kv_shift.window = o.window;
}

}  // namespace

std::string import_hf(const ImportOptions& o) {
  const std::string& init = o.kv_shift_init;
  KVS_CHECK(init == "none" || init == "paper" || init == "identity",
            "--kv-shift-init: must be none, paper or identity, got '{}'", init);
  KVS_CHECK(fs::is_directory(o.model), "{}: not a directory", o.model);
  const std::string cfg_path = o.model + "/config.json";
  const json source_config = read_json(cfg_path);
  ModelConfig m = import_config(source_config, cfg_path);
  const bool had_shift = m.kv_shift.enabled;
  if (init != "none") {
    KVS_CHECK(!had_shift, "{}: the model already has KV shift parameters (use --kv-shift-init none)", cfg_path);
    add_shift(o, m);
  }
  auto weights = read_weights(o.model);

  const ParamLayout layout = ParamLayout::build(m);
  // Each tensor is converted straight into its output tensor, and its input
  // freed: the peak is the input plus one fp32 copy of the model.
  std::vector<StTensor> tensors;
  tensors.reserve(layout.tensors.size());
  for (const auto& t : layout.tensors) {
    StTensor& out = tensors.emplace_back(StTensor{t.name, DType::F32, t.shape, {}});
    out.bytes.resize(t.numel * sizeof(float));
    float* dst = reinterpret_cast<float*>(out.bytes.data());
    if (t.kind == ParamKind::Shift && !had_shift) {
      if (init == "identity") {
        const int64_t cols = t.shape[1];
        for (int64_t i = 0; i < t.shape[0] * cols; ++i) dst[i] = (i % cols == cols - 1) ? 1.0f : 0.0f;
      } else {
        init_param_range(t, m, o.seed, 0, t.numel, dst);  // the paper's initialisation
      }
      continue;
    }
    auto it = weights.find(t.name);
    KVS_CHECK(it != weights.end(), "{}: missing tensor '{}'", o.model, t.name);
    const Located& w = it->second;
    const DType d = w.tensor.dtype;
    KVS_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::F64,
              "{}: tensor '{}' has dtype {} (supported: F32, BF16, F16, F64)", w.file, t.name, dtype_name(d));
    KVS_CHECK(w.tensor.shape == t.shape, "{}: tensor '{}' has shape {}, expected {} from config.json", w.file, t.name,
              shape_str(w.tensor.shape), shape_str(t.shape));
    const std::vector<float> v = tensor_to_f32(w.tensor);
    check_finite_values(v, w.file, t.name, "refusing to import a broken model");
    std::copy(v.begin(), v.end(), dst);
    weights.erase(it);
  }
  for (const auto& [name, w] : weights)
    KVS_CHECK(ignorable(name, m), "{}: unexpected tensor '{}' (not part of a {}-layer model of this config)", w.file,
              name, m.num_hidden_layers);
  weights.clear();

  StagedDir out(o.out, o.force, {o.model});
  // The model's end-of-text ids (generation_config.json's, else config.json's;
  // an id or a list, as Llama 3's): generate stops at them without a tokenizer.
  json config = model_to_hf_json(m);
  json eos = source_config.value("eos_token_id", json());
  if (fs::exists(o.model + "/generation_config.json")) {
    const json g = read_json(o.model + "/generation_config.json");
    if (g.is_object() && g.contains("eos_token_id") && !g["eos_token_id"].is_null()) eos = g["eos_token_id"];
  }
  if (!eos.is_null()) config["eos_token_id"] = eos;
  model_from_hf_json(config, cfg_path);  // an eos_token_id that is no token id of the model is an error here
  write_json_file(out.file("config.json"), config);
  write_safetensors(out.file("model.safetensors"), tensors);
  // The tokenizer as a kvshift tokenizer directory (its kvshift_tokenizer.json
  // too), so generate, data prepare and export-hf take it as `tokenizer train`'s.
  const bool tok = fs::exists(o.model + "/tokenizer.model");
  if (tok) {
    const std::string model_path = o.model + "/tokenizer.model", bytes = read_file(model_path);
    static const char* const kModelTypes[] = {"", "unigram", "bpe", "word", "char"};
    const int type = read_sentencepiece_model(model_path).model_type;
    TokenizerMeta meta =
        sentencepiece_meta(bytes, type >= 1 && type <= 4 ? kModelTypes[type] : std::to_string(type), model_path);
    KVS_CHECK(meta.vocab_size <= m.vocab_size, "{}: {} pieces, more than the model's vocab_size {}", model_path,
              meta.vocab_size, m.vocab_size);
    meta.trainer = {{"imported_from", fs::absolute(model_path).lexically_normal().string()}};
    make_dirs(out.file("tokenizer"));
    atomic_write_file(out.file("tokenizer/tokenizer.model"), bytes);
    write_json_file(out.file(std::string("tokenizer/") + kTokenizerMetaFile), tokenizer_meta_json(meta));
  }
  out.commit();
  // transformers' save_pretrained of a fast tokenizer writes tokenizer.json alone; kvshift reads
  // sentencepiece models only (after the commit: an error stays the only line of a failed run).
  if (!tok && fs::exists(o.model + "/tokenizer.json"))
    spdlog::warn("{}: tokenizer.json but no tokenizer.model: imported without a tokenizer (kvshift reads the "
                 "sentencepiece tokenizer.model, which save_pretrained of a fast tokenizer does not write: copy it "
                 "there from the export it came from and import again)",
                 o.model);
  return fmt::format("imported {} -> {}: {} tensors, KV shift {}{}{}", o.model, o.out, tensors.size(),
                     describe_kv_shift(m.kv_shift),
                     init == "none" ? "" : fmt::format(" (new, {} init)", init),
                     tok ? ", tokenizer in tokenizer/" : "");
}

}  // namespace kvs::hf
