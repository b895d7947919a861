// Glue between engines and checkpoint files: parameters and AdamW moments as
// named safetensors tensors (names from ParamLayout), and back.
#pragma once
#include <string>
#include <vector>

#include "model/engine.h"
#include "train/checkpoint.h"

namespace kvs {

std::vector<StTensor> model_tensors(const Engine& e);
std::vector<StTensor> optimizer_tensors(const Engine& e);  // "exp_avg.<name>", "exp_avg_sq.<name>"
// The same from full moment buffers held outside an engine (ZeRO-1 gathers them).
std::vector<StTensor> optimizer_tensors(const ParamLayout& layout, const std::vector<float>& exp_avg,
                                        const std::vector<float>& exp_avg_sq);

// Copies tensors into the engine after checking names and shapes exactly;
// errors name `file` and the tensor.
void load_model_tensors(Engine& e, const std::vector<StTensor>& tensors, const std::string& file);
void load_optimizer_tensors(Engine& e, const std::vector<StTensor>& tensors, const std::string& file);

// A checkpoint directory with its model config parsed from config.json.
struct LoadedCheckpoint {
  std::string dir;
  ModelConfig model;
  CheckpointData data;
};
LoadedCheckpoint read_checkpoint(const std::string& dir);

}  // namespace kvs
