// Checkpoint directories with their model config parsed, read whole (one
// process) or opened for reading slices (the trainer's ranks).
#pragma once
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "train/checkpoint.h"

namespace kvs {

// A checkpoint directory read whole, with its model config parsed from
// config.json (one process: eval, generate, export-hf, inspect): without the
// optimizer state unless asked for.
struct LoadedCheckpoint {
  std::string dir;
  ModelConfig model;
  CheckpointData data;
};
LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer = false);
// Its weights as one flat buffer in ParamLayout::build(ck.model) order, after
// checking names and shapes exactly (errors name model.safetensors).
std::vector<float> checkpoint_weights(const LoadedCheckpoint& ck);

// The same opened for reading slices (CheckpointFiles): what the trainer
// uses, each rank reading its own part (FullModelIO::read_local). Without
// the optimizer file (neither opened nor verified) when with_optimizer is false.
struct OpenedCheckpoint {
  std::string dir;
  ModelConfig model;
  CheckpointFiles files;
};
OpenedCheckpoint open_model_checkpoint(const std::string& dir, bool with_optimizer = true);

}  // namespace kvs
