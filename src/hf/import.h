// `kvshift import-hf`: a Llama/Mistral-style Hugging Face model directory
// (config.json + model.safetensors or an index of shards; BF16/F16/F32) -> a
// kvshift checkpoint directory (config.json + fp32 model.safetensors, model
// only: no optimizer or trainer state), optionally with new shift parameters.
#pragma once
#include <cstdint>
#include <string>

namespace kvs::hf {

struct ImportOptions {
  std::string model;                  // the Hugging Face directory
  std::string out;
  std::string kv_shift_init = "none";  // "none" | "paper" | "identity"
  int window = 1;                      // window of newly added shift parameters
  uint64_t seed = 1234;                // seeds "paper" (init_params' rule)
  bool force = false;
};

// Returns a one-line summary of what was written.
std::string import_hf(const ImportOptions& o);

}  // namespace kvs::hf
