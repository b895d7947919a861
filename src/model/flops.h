// Model FLOPs and memory estimates (DESIGN.md, "Performance conventions").
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/params.h"

namespace kvs {

// Training FLOPs per token: 6·N_nonembedding + 6·N_lm_head + 6·L·T·d_head·n_heads
// (attention scores and values, causal-halved, as llm.c and Megatron count it).
// N_lm_head is vocab·hidden whether or not the embedding is tied (it is a matmul either way).
inline double train_flops_per_token(const ModelConfig& m, int seq_len) {
  const ParamCounts c = count_params(m);
  const double lm_head = static_cast<double>(m.vocab_size) * m.hidden_size;
  const double attn = 6.0 * m.num_hidden_layers * seq_len * m.head_dim() * m.num_attention_heads;
  return 6.0 * static_cast<double>(c.non_embedding) + 6.0 * lm_head + attn;
}

inline const char* kFlopsFormula = "6*N_nonembedding + 6*N_lm_head + 6*L*T*d_head*n_heads per token";

}  // namespace kvs
