// config.json of a Hugging Face export and of a Llama/Mistral-style model to
// import: the mapping between Hugging Face's keys and ModelConfig.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace kvs::hf {

// Special token ids of the exported tokenizer; -1 = none.
struct SpecialIds {
  int bos = -1, eos = -1, pad = -1, unk = -1;
};

// A model without any shift and with RoPE is a plain LlamaForCausalLM; anything
// else needs the modeling file (trust_remote_code).
bool needs_remote_code(const ModelConfig& m);

// config.json of an export. `torch_dtype` is "float32" or "bfloat16".
nlohmann::json export_config(const ModelConfig& m, const std::string& torch_dtype, const SpecialIds& ids);

// generation_config.json of an export. Ids from `tokenizer_size` up to the
// model's `vocab_size` (a vocabulary padded past the tokenizer's pieces) are
// suppressed, as `kvshift generate` never picks them: they have no text.
nlohmann::json generation_config(const SpecialIds& ids, int tokenizer_size, int vocab_size);

// Reads a Hugging Face config.json of model_type llama, mistral or kvshift_llama.
// Keys without a meaning for the model (bos ids, dtype, ...) are ignored; keys
// that would change the model in a way kvshift cannot express (a RoPE type other
// than default and llama3, biases, a sliding window, another activation) are
// one-line errors naming `origin`. RoPE: rope_keys.h.
ModelConfig import_config(const nlohmann::json& j, const std::string& origin);

}  // namespace kvs::hf
