// The model's RoPE frequencies (θ and model.rope_scaling) in the form the
// table builder takes: one mapping for the CPU engine, the CUDA engine (which
// uploads the CPU tables) and the generator.
#pragma once
#include "kernels/cpu/rope.h"
#include "model/config.h"

namespace kvs {

inline cpu::RopeFrequencies rope_frequencies(const ModelConfig& m) {
  cpu::RopeFrequencies f(m.rope_theta);
  const RopeScalingConfig& s = m.rope_scaling;
  if (s.rope_type == RopeType::Llama3) {
    f.llama3 = true;
    f.factor = s.factor;
    f.low_freq_factor = s.low_freq_factor;
    f.high_freq_factor = s.high_freq_factor;
    f.original_max_position_embeddings = s.original_max_position_embeddings;
  }
  return f;
}

}  // namespace kvs
