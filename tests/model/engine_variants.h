// The model variants on which the CUDA engine is compared with the CPU engine
// (tests/model/test_cuda_engine.cpp on a GPU, tests/cuda_host/test_engine.cpp
// on the host build): head_dim 16 (MHA and GQA), 32 (tied), 64 and 128;
// window 3 with q shifted; the sigmoid gate without RoPE. One table, so the
// two checks cannot drift apart.
#pragma once
#include <ostream>

#include "model/config.h"

namespace kvs::testing_util {

struct EngineVariant {
  const char* name;  // also a gtest parameter name: letters, digits, '_'
  int hidden, heads, kv_heads, layers;
  bool shift, tied;
  int window;
  bool shift_q;
  const char* param;  // kv_shift.parametrization
  const char* pos;    // position_encoding
};

// Test names and failure messages show the variant's name, not its bytes.
inline void PrintTo(const EngineVariant& v, std::ostream* os) { *os << v.name; }

inline ModelConfig model_of(const EngineVariant& v) {
  nlohmann::json j = {{"name", v.name},
                      {"model",
                       {{"hidden_size", v.hidden},
                        {"intermediate_size", 2 * v.hidden + 8},
                        {"num_hidden_layers", v.layers},
                        {"num_attention_heads", v.heads},
                        {"num_key_value_heads", v.kv_heads},
                        {"vocab_size", 96},
                        {"max_position_embeddings", 64},
                        {"tie_word_embeddings", v.tied},
                        {"position_encoding", v.pos},
                        {"kv_shift",
                         {{"enabled", v.shift},
                          {"window", v.window},
                          {"shift_q", v.shift_q},
                          {"parametrization", v.param}}}}},
                      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 96}, {"pool_size", 8}}}}},
                      {"train", {{"seq_len", 64}}}};
  Config c = config_from_json(j, v.name);
  validate(c, v.name);
  return c.model;
}

inline const EngineVariant kEngineVariants[] = {
    {"vanilla_mha", 64, 4, 4, 2, false, false, 1, false, "free", "rope"},
    {"shift_gqa", 64, 4, 2, 2, true, false, 1, false, "free", "rope"},
    {"shift_gqa_tied_d32", 64, 2, 1, 2, true, true, 1, false, "free", "rope"},
    {"shift_window3_qkv", 64, 4, 2, 1, true, false, 3, true, "free", "rope"},
    {"shift_gate_norope", 64, 4, 4, 1, true, false, 1, false, "sigmoid_gate", "none"},
    {"shift_d64", 128, 2, 1, 1, true, false, 1, false, "free", "rope"},
    {"shift_d128", 256, 2, 2, 1, true, false, 2, false, "free", "rope"},
};
// Three layers (the last one is not recomputed) and the sigmoid gate (its
// effective coefficients are reused, not recomputed): recomputation's check.
inline const EngineVariant kRecomputeVariant{"recompute", 64, 4, 2, 3, true, false, 1, false, "sigmoid_gate", "rope"};

}  // namespace kvs::testing_util
