// Helpers shared by the subcommands that read a checkpoint.
#pragma once
#include <spdlog/spdlog.h>

#include <cmath>
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
// (its `latest`), the `latest` file itself, or a run dir (its
// checkpoints/latest). Without `latest` (a crash between the two renames of a
// save, or removed by hand): the newest step directory, with a warning, as
// --resume does.
inline std::string resolve_checkpoint_dir(std::string dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir + "/model.safetensors", ec)) return dir;  // a step directory
  if (fs::path(dir).filename() == "latest" && fs::is_regular_file(dir, ec))  // the pointer: what it names
    return latest_checkpoint(fs::path(dir).has_parent_path() ? fs::path(dir).parent_path().string() : ".");
  if (fs::is_directory(dir + "/checkpoints", ec)) dir += "/checkpoints";
  if (fs::exists(dir + "/latest", ec)) return latest_checkpoint(dir);
  const auto steps = list_checkpoints(dir);
  if (steps.empty()) {
    if (fs::exists(dir + "/checkpoints", ec))  // there, but not a directory
      fail("{}/checkpoints is not a directory (a run directory keeps its step_* checkpoints there)", dir);
    return dir;  // the reader says what is missing
  }
  spdlog::warn("{}/latest is missing: reading the newest step directory, {}", dir, steps.front().second);
  return steps.front().second;
}

// The value of a --device flag.
inline Device device_flag(const std::string& name) {
  if (auto d = enum_from_string<Device>(name)) return *d;
  fail("unknown device '{}' (expected {})", name, enum_choices<Device>('\''));
}

// An engine holding the checkpoint's weights, sized for B x T micro-batches,
// read into it a tensor at a time (read_model_weights: non-finite weights are
// refused, as eval, generate and export-hf refuse them).
inline std::unique_ptr<Engine> engine_for(const OpenedCheckpoint& ck, int B, int T, Device device) {
  auto e = make_engine(ck.model, B, T, device);
  read_model_weights(ck, [&](const ParamTensor& t, const float* w) { e->write_params_range(t.offset, t.numel, w); });
  return e;
}

}  // namespace kvs::cli
