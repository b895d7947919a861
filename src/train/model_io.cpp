#include "train/model_io.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace kvs {
namespace {

// A checkpoint's model. A Hugging Face directory (an export-hf output, a
// model transformers saved) fails on transformers' own keys: say what it is
// and how to read it, not which key.
ModelConfig checkpoint_model(const nlohmann::json& config, const std::string& dir) {
  try {
    return model_from_hf_json(config, dir + "/config.json");
  } catch (const Error& e) {
    // transformers writes its version; export-hf writes the LlamaConfig keys kvshift's own config.json has not.
    bool hf = false;
    for (const char* key : {"transformers_version", "auto_map", "use_cache", "attention_dropout", "pretraining_tp"})
      hf = hf || (config.is_object() && config.contains(key));
    if (hf)
      fail("{}: a Hugging Face model directory (its config.json is transformers'): `kvshift import-hf --model {} "
           "--out DIR` makes a checkpoint of it ({})",
           dir, dir, e.what());
    throw;
  }
}

}  // namespace

LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer) {
  LoadedCheckpoint c;
  c.dir = dir;
  c.data = load_checkpoint(dir, with_optimizer);
  c.model = checkpoint_model(c.data.hf_config, dir);
  return c;
}

std::vector<float> checkpoint_weights(const LoadedCheckpoint& ck) {
  const ParamLayout layout = ParamLayout::build(ck.model);
  validate_layout_tensors(ck.data.model, layout, {""}, ck.dir + "/model.safetensors");
  std::vector<float> flat(layout.total);
  for (const auto& st : ck.data.model) {
    const std::vector<float> v = tensor_to_f32(st);
    std::memcpy(flat.data() + layout.find(st.name)->offset, v.data(), v.size() * sizeof(float));
  }
  return flat;
}

OpenedCheckpoint open_model_checkpoint(const std::string& dir, bool with_optimizer) {
  CheckpointFiles files = open_checkpoint(dir, with_optimizer);
  ModelConfig model = checkpoint_model(files.hf_config, dir);
  return OpenedCheckpoint{dir, std::move(model), std::move(files)};
}

}  // namespace kvs
