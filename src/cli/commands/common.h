// Helpers shared by the subcommands that read a checkpoint.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "core/error.h"
#include "model/config_enums.h"
#include "model/engine.h"
#include "train/checkpoint.h"
#include "train/model_io.h"

namespace kvs::cli {

// --checkpoint as eval and inspect take it: a step_* dir, a checkpoints/ dir
// (its `latest`) or a run dir (its checkpoints/latest).
inline std::string resolve_checkpoint_dir(std::string dir) {
  if (std::filesystem::exists(dir + "/checkpoints/latest")) dir += "/checkpoints";
  if (std::filesystem::exists(dir + "/latest")) dir = latest_checkpoint(dir);
  return dir;
}

// The value of a --device flag.
inline Device device_flag(const std::string& name) {
  if (auto d = enum_from_string<Device>(name)) return *d;
  fail("unknown device '{}' (expected {})", name, enum_choices<Device>('\''));
}

// An engine holding the checkpoint's weights, sized for B x T micro-batches.
inline std::unique_ptr<Engine> engine_for(const LoadedCheckpoint& ck, int B, int T, Device device) {
  auto e = make_engine(ck.model, B, T, device);
  e->write_params(checkpoint_weights(ck).data());
  return e;
}

}  // namespace kvs::cli
