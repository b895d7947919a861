// Checkpoint directories with their model config parsed, read whole (one
// process) or opened for reading slices (the trainer's ranks).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "train/checkpoint.h"

namespace kvs {

// A checkpoint directory read whole, with its model config parsed from
// config.json (one process: export-hf, inspect): without the
// optimizer state unless asked for.
struct LoadedCheckpoint {
  std::string dir;
  ModelConfig model;
  CheckpointData data;
};
LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer = false);

// The same opened for reading slices (CheckpointFiles): what the trainer
// uses, each rank reading its own part (FullModelIO::read_local). Without
// the optimizer file (neither opened nor verified) when with_optimizer is false.
struct OpenedCheckpoint {
  std::string dir;
  ModelConfig model;
  CheckpointFiles files;
};
OpenedCheckpoint open_model_checkpoint(const std::string& dir, bool with_optimizer = true);

// Its weights, read straight from model.safetensors a tensor at a time after
// checking names and shapes exactly (errors name the file), each handed to
// `take` as fp32 in ParamLayout::build(ck.model) order: a one-process command
// then holds the weights once (its engine's or generator's copy), not also
// the file's tensors. A weight that is not finite is refused ("refusing to
// run a broken model", or `refusing`): it would give NaN logits that look
// like results.
void read_model_weights(const OpenedCheckpoint& ck, const std::function<void(const ParamTensor&, const float*)>& take,
                        const char* refusing = "refusing to run a broken model");
// The same as one flat buffer in that order.
std::vector<float> read_model_weights(const OpenedCheckpoint& ck);

}  // namespace kvs
