// Incremental decoding on the CPU with a KV cache: one token in, the logits of
// the next one out, in O(t) per token instead of a full forward over the
// prefix. Each layer is CpuEngine's decoder layer (model/cpu_block.h) on the
// same parameter views (bind_params), run on a block of new positions that
// attends to the cache of the positions before it.
//
// The cache of each layer holds two things (docs/ARCHITECTURE.md, "Generation"):
//   - K̂ and V̂ as attention reads them (K̂ = RoPE(Shift(k)), V̂ = Shift(v)) for
//     every past position, [max_len, kv_dim] each, allocated once;
//   - the last W RAW projections k, v (and q under shift_q), before the shift
//     and before RoPE: the layer's halo. The shift of position t mixes its raw
//     projection with the raw ones of t-1..t-W: mixing with the already-shifted
//     K̂_{t-1} (or with zeros) would give a different model than the one trained.
// With model.document_boundaries, a BOS token restarts the shift (and, for
// "shift_and_attention", the attention) as CpuEngine does for packed documents.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace kvs {

// What the shift window remembers of the past. Only Raw is the model; the
// others are the classic cache bugs, kept so tests can show they are caught.
enum class ShiftHistory {
  Raw,    // the raw projections (correct)
  Mixed,  // what the cache keeps for attention (bug: k_t mixes with the shifted, rotated K̂_{t-1})
  Zeros,  // nothing (bug: every position mixes with zeros, as position 0 does)
};

struct GeneratorOptions {
  ShiftHistory history = ShiftHistory::Raw;  // tests only
  // Prompt tokens run through the layers together, this many at a time (one
  // matrix product per projection instead of one per token); the scratch
  // buffers hold this many rows. The cache bugs above run token by token.
  int prefill_chunk = 64;
};

class Generator {
 public:
  // `params` is the flat fp32 buffer in ParamLayout::build(m) order (as
  // Engine::read_params gives it). The cache holds max_len positions, which
  // must not exceed m.max_position_embeddings.
  Generator(const ModelConfig& m, std::vector<float> params, int max_len, GeneratorOptions opt = {});
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const ModelConfig& model() const { return m_; }
  int max_len() const { return max_len_; }
  int pos() const { return pos_; }  // positions filled so far
  int vocab_size() const { return m_.vocab_size; }

  // Forgets the sequence (the cache's memory is kept).
  void reset();
  // Appends `token` at position pos() and returns the logits [vocab_size]
  // predicting position pos()+1; valid until the next call.
  const float* step(int32_t token);
  // Appends `tokens` (in chunks of prefill_chunk); returns the logits after
  // the last one. The same numbers as stepping token by token, up to rounding.
  const float* prefill(const std::vector<int32_t>& tokens);

 private:
  struct LayerCache {
    std::vector<float> khat, vhat;  // [max_len, KD]: what attention reads
    // The raw projections of positions t-W..t-1, [W, row] (zeros before
    // position 0); empty for a tensor that is not shifted.
    std::vector<float> qhalo, khalo, vhalo;
  };
  // Runs tokens[0..n) at positions pos_..pos_+n-1; the logits of the last one.
  const float* forward_block(const int32_t* tokens, int n);
  // Moves a halo on by the n new rows: it keeps the last W of (halo, rows).
  void advance(std::vector<float>& halo, const float* rows, int n, size_t row) const;

  ModelConfig m_;
  ParamLayout layout_;
  std::vector<float> params_;
  ModelView P_;
  int max_len_, pos_ = 0;
  // model.document_boundaries: where the current document started (a BOS
  // starts one), and per row of a block its document's start as a position
  // (doc_) and in the block's row coordinates (row_doc_, for the shift).
  int doc_start_ = 0;
  std::vector<int32_t> doc_, row_doc_;
  GeneratorOptions opt_;
  int chunk_;  // rows per block
  std::vector<LayerCache> cache_;
  std::vector<float> rope_cos_, rope_sin_;
  // One block of up to chunk_ rows: the layer's activations (x is its input and
  // output), attention probabilities over the whole cache, the logits.
  std::vector<float> x_, mid_, ln_, rstd_, qraw_, q_, kraw_, vraw_, att_, attout_, gate_up_, h_, coef_, logits_;
};

}  // namespace kvs
