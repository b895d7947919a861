#include "train/model_io.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace kvs {

LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer) {
  LoadedCheckpoint c;
  c.dir = dir;
  c.data = load_checkpoint(dir, with_optimizer);
  c.model = model_from_hf_json(c.data.hf_config, dir + "/config.json");
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
  ModelConfig model = model_from_hf_json(files.hf_config, dir + "/config.json");
  return OpenedCheckpoint{dir, std::move(model), std::move(files)};
}

}  // namespace kvs
