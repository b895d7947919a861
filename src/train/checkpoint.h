// Checkpoints: one directory per save, readable by Hugging Face with the
// project's modeling file (see docs/FORMATS.md):
//   <root>/step_00000100/config.json           HF LlamaConfig keys + kv_shift
//   <root>/step_00000100/model.safetensors     fp32, HF Llama tensor names + k_shift/v_shift
//   <root>/step_00000100/optimizer.safetensors "exp_avg.<name>", "exp_avg_sq.<name>" (optional)
//   <root>/step_00000100/trainer_state.json    step, RNG, data position, ... (optional)
//   <root>/step_00000100/run_config.json       the full kvshift config (optional)
//   <root>/step_00000100/manifest.json         size and XXH3-64 of each file but run_config.json (written last)
//   <root>/latest                              text file naming the newest complete step dir
// A save writes everything into "<root>/.tmp-step_...", fsyncs, renames the
// directory into place, then atomically rewrites `latest`. A crash at any
// point leaves the previous `latest` checkpoint complete and untouched.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "model/params.h"
#include "train/tensor_stream.h"

namespace kvs {

struct CheckpointData {
  nlohmann::json hf_config;               // config.json (required)
  std::vector<StTensor> model;            // model.safetensors (required)
  std::vector<StTensor> optimizer;        // optimizer.safetensors (written only if non-empty)
  nlohmann::json trainer_state;           // trainer_state.json (written only if non-null)
  nlohmann::json run_config;              // run_config.json (written only if non-null)
  std::string run_config_error;           // loaded: why run_config.json did not parse (CheckpointFiles)
  bool verified = false;                  // loaded: every file matched manifest.json
  // A streamed save: `model` and `optimizer` hold the tensors' headers only,
  // and their bytes come from `stream`, model tensors first, in order.
  std::shared_ptr<TensorStream> stream;
};

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"

// Saves under `root` and returns the new directory's path. Keeps the newest
// `keep_last` step directories (0 = keep all) and deletes older ones only after
// the new one is complete.
std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointData& data, int keep_last = 0);

// Creates `root` and checks that a checkpoint's deepest file can be written in
// it: the trainer calls it before its first step, so a checkpoint directory
// that cannot be written (a dangling link to unmounted scratch, a file in its
// place, no permission, a path too long for a save's files) stops the run at
// once, not at its first save.
void check_checkpoint_root_writable(const std::string& root);

// Path of the newest complete checkpoint under `root` per its `latest` file, or
// "" if there is none. Throws if `latest` names a missing directory.
std::string latest_checkpoint(const std::string& root);

// Loads one checkpoint directory. config.json and model.safetensors are required;
// the optional files are loaded when present (empty/null otherwise). Any missing
// required file, unreadable JSON or corrupt safetensors gives a kvs::Error naming the file.
// Then every file is checked against manifest.json (checkpoint_manifest.h); a
// checkpoint without one (older kvshift, or made by hand) loads with
// `verified` false (the trainer warns on resume).
// with_optimizer false: optimizer.safetensors is neither read nor checked
// (inference needs the weights only; the moments are twice their size).
CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer = true);

// A checkpoint opened without reading its tensors: the same files, checks and
// manifest verification as load_checkpoint, with model.safetensors and
// optimizer.safetensors left open for reading tensors (or slices of them) one
// at a time. The trainer loads each rank's slice this way (FullModelIO), so no
// rank holds the whole model in host memory.
// run_config.json is a copy for reference that may be edited (outside the
// manifest): one that does not parse leaves run_config null and says why in
// run_config_error, for the readers that need it (eval without --config,
// export's tokenizer, resume's checks); the others never fail on it.
struct CheckpointFiles {
  nlohmann::json hf_config, trainer_state, run_config;  // as in CheckpointData
  std::string run_config_error;                          // "" when run_config.json is absent or parses
  std::optional<SafetensorsReader> model, optimizer;    // model always; optimizer when the file exists
  bool verified = false;
};
CheckpointFiles open_checkpoint(const std::string& dir, bool with_optimizer = true);

// The step directories under `root` (whatever `latest` says), newest step first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);

// Checks that `got` holds exactly the `expected` tensors (name -> shape), each with
// a float dtype (F32/BF16/F16/F64). Throws a kvs::Error prefixed with `file`
// ("<file>: missing tensor 'lm_head.weight'", "... has shape [8], expected [16]",
// "... unexpected tensor 'foo'"), reporting the first problem and how many more there are.
void validate_model_tensors(const std::vector<StTensor>& got,
                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                            const std::string& file);
// The same with `layout`'s tensors (full shapes) expected under each of `prefixes`.
void validate_layout_tensors(const std::vector<StTensor>& got, const ParamLayout& layout,
                             const std::vector<std::string>& prefixes, const std::string& file);

}  // namespace kvs
