#include "train/model_io.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/safetensors.h"

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

OpenedCheckpoint open_model_checkpoint(const std::string& dir, bool with_optimizer) {
  CheckpointFiles files = open_checkpoint(dir, with_optimizer);
  ModelConfig model = checkpoint_model(files.hf_config, dir);
  return OpenedCheckpoint{dir, std::move(model), std::move(files)};
}

void read_model_weights(const OpenedCheckpoint& ck, const std::function<void(const ParamTensor&, const float*)>& take,
                        const char* refusing) {
  const SafetensorsReader& file = *ck.files.model;
  const ParamLayout layout = ParamLayout::build(ck.model);
  validate_layout_tensors(file.tensors(), layout, {""}, file.path());
  std::vector<float> v;
  for (const ParamTensor& t : layout.tensors) {
    v.resize(t.numel);
    file.read_f32(*file.find(t.name), 0, t.numel, v.data());
    check_finite_values(v, file.path(), t.name, refusing);
    take(t, v.data());
  }
}

std::vector<float> read_model_weights(const OpenedCheckpoint& ck) {
  std::vector<float> flat(ParamLayout::build(ck.model).total);
  read_model_weights(ck,
                     [&](const ParamTensor& t, const float* w) { std::copy_n(w, t.numel, flat.data() + t.offset); });
  return flat;
}

}  // namespace kvs
