// `kvshift export-hf`: a checkpoint directory -> a Hugging Face model directory
// (config.json, model.safetensors or shards + index, generation_config.json,
// the modeling files when the model needs them, tokenizer files). docs/HF.md.
#pragma once
#include <cstdint>
#include <string>

namespace kvs::hf {

struct ExportOptions {
  std::string checkpoint;          // a step directory (already resolved)
  std::string out;
  std::string dtype = "bf16";      // "bf16" | "fp32"
  std::string tokenizer;           // "" = the run config's data.tokenizer, if any
  uint64_t max_shard_bytes = 5000000000ull;
  bool force = false;
};

// Returns a one-line summary of what was written.
std::string export_hf(const ExportOptions& o);

}  // namespace kvs::hf
