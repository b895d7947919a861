// The tiny induction run the training tests share (tests/train): one layer, hidden 16, vocabulary
// 32, sequences of 16, 12 steps of micro-batches 4 x 2 at lr 1e-2 with 2 warmup steps, evaluated
// every 6 steps, on 2 threads. A test puts the `train` entries it is about on top.
#pragma once
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace kvs::testing_util {

inline Config tiny_induction(bool shift, const nlohmann::json& train = nlohmann::json::object()) {
  nlohmann::json j = {
      {"name", "tiny"},
      {"model",
       {{"hidden_size", 16},
        {"intermediate_size", 32},
        {"num_hidden_layers", 1},
        {"num_attention_heads", 2},
        {"num_key_value_heads", 1},
        {"vocab_size", 32},
        {"max_position_embeddings", 16},
        {"kv_shift", {{"enabled", shift}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 32}, {"pool_size", 8}}}}},
      {"train",
       {{"seq_len", 16},
        {"micro_batch_size", 4},
        {"grad_accum_steps", 2},
        {"steps", 12},
        {"lr", 1e-2},
        {"warmup_steps", 2},
        {"eval_every", 6},
        {"eval_sequences", 8},
        {"threads", 2}}}};
  j["train"].update(train);
  Config c = config_from_json(j, "tiny");
  validate(c, "tiny");
  return c;
}

}  // namespace kvs::testing_util
