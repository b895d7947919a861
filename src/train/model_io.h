// Glue between engines and checkpoint files: parameters and AdamW moments as
// named safetensors tensors (names from ParamLayout), and back.
#pragma once
#include <string>
#include <vector>

#include "model/engine.h"
#include "train/checkpoint.h"

namespace kvs {

std::vector<StTensor> model_tensors(const Engine& e);
// The same from a flat buffer laid out by `layout` (a full model gathered
// from tensor-parallel ranks), with `prefix` before every name.
std::vector<StTensor> tensors_from_flat(const ParamLayout& layout, const std::vector<float>& flat,
                                        const std::string& prefix = "");
// Fills `flat` (layout.total floats) from tensors named prefix + layout name,
// after checking the exact name set and shapes; errors name `file`.
void flat_from_tensors(const ParamLayout& layout, const std::vector<StTensor>& tensors, const std::string& prefix,
                       const std::string& file, std::vector<float>& flat);
// Splits optimizer tensors into full exp_avg / exp_avg_sq buffers laid out by `layout`.
void moments_from_tensors(const ParamLayout& layout, const std::vector<StTensor>& tensors, const std::string& file,
                          std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq);
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
