// RoPE in a Hugging Face config.json, in both dialects of transformers:
//   4.x: "rope_theta": θ, "rope_scaling": null | {"rope_type": "llama3", "factor", ...}
//   5.x: "rope_parameters": {"rope_type": "default" | "llama3", "rope_theta": θ, ...}
// An export writes both (each line reads its own; 5.x takes a non-null
// rope_scaling over rope_parameters, so the two must agree). An import reads
// all three, refuses keys that disagree, and refuses every RoPE variant
// kvshift does not implement in one line naming the key and its value, never
// dropping it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace kvs::hf {

// Sets rope_theta, rope_scaling and rope_parameters of `j` from the model.
void write_rope_keys(const ModelConfig& m, nlohmann::json& j);

// Reads θ and the scaling into m.rope_theta / m.rope_scaling. Absent keys mean
// θ = 10000 and plain RoPE (LlamaConfig's defaults in both lines).
void read_rope_keys(const nlohmann::json& j, const std::string& origin, ModelConfig& m);

}  // namespace kvs::hf
