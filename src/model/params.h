// Parameter layout: every parameter of the model as a named slice of one flat
// fp32 buffer, in a fixed order. Gradients and optimizer moments use the same
// layout, so "for every tensor" loops are loops over this table.
// Names are Hugging Face Llama names plus the shift tensors
// model.layers.{i}.self_attn.{k,v}_shift ([num_key_value_heads, window+1]) and,
// with kv_shift.shift_q, model.layers.{i}.self_attn.q_shift ([num_attention_heads, window+1]).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace kvs {

struct ModelPart;  // parallel/pipeline.h

enum class ParamKind {
  Embedding,  // token embedding (decayed)
  Matrix,     // a projection weight (decayed)
  Norm,       // RMSNorm gain (not decayed, init 1)
  Shift,      // q_shift / k_shift / v_shift scalars (not decayed, init per the paper)
};

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats, into the flat buffer
  size_t numel = 0;
  ParamKind kind = ParamKind::Matrix;
  // Tensor parallelism (parallel/tensor_parallel.h): the dimension this tensor is
  // cut along across TP ranks (-1: replicated) and the full tensor's shape
  // (vocabulary padding excluded). shape is this rank's slice.
  int split_dim = -1;
  std::vector<int64_t> full_shape;
  bool decay() const { return kind == ParamKind::Embedding || kind == ParamKind::Matrix; }
};

struct ParamLayout {
  std::vector<ParamTensor> tensors;
  size_t total = 0;  // floats

  // The tensors of tensor-parallel rank tp_rank of tp (tp = 1: the full model),
  // and of a pipeline stage's part only when `part` is given (the same order,
  // the tensors it does not hold left out; with tied embeddings a part with the
  // head but not the embedding still holds the embedding, as its LM head).
  static ParamLayout build(const ModelConfig& m, int tp_rank = 0, int tp = 1, const ModelPart* part = nullptr);
  const ParamTensor* find(const std::string& name) const;  // nullptr if absent
};

// Typed views of one flat buffer (parameters or gradients).
struct LayerView {
  float *ln1, *wq, *wk, *wv, *wo, *q_shift, *k_shift, *v_shift, *ln2, *w_gate, *w_up, *w_down;
};
// Tensors a layout leaves out (a pipeline stage's) are null.
struct ModelView {
  float* embed;
  std::vector<LayerView> layers;
  float* norm;
  float* lm_head;  // == embed when tied
};
ModelView bind_params(const ParamLayout& layout, const ModelConfig& m, float* base);

// Initialises parameters: matrices ~ N(0, initializer_range^2), norms = 1,
// shifts (per KV head, for K and V separately): the W older columns ~ U(0,1),
// current = 1 - their sum (window 1: prev ~ U(0,1), cur = 1 - prev).
// parametrization "sigmoid_gate" stores [0, logit(1 - u)] per head instead, so
// the effective coefficients (prev = u, cur = 1 - u) are the same draw.
// Every element is a pure function of (seed, tensor name, index), so any
// layout or slice of the model gets the same values.
void init_params(const ParamLayout& layout, const ModelConfig& m, uint64_t seed, float* base);
// Elements [first, first + n) of tensor `t` (a full tensor: shape = full shape)
// as init_params sets them, into out[0..n): a rank initialises its slice alone.
void init_param_range(const ParamTensor& t, const ModelConfig& m, uint64_t seed, size_t first, size_t n, float* out);

struct ParamCounts {
  int64_t total = 0;          // all parameters, shift scalars excluded (as the paper counts)
  int64_t embedding = 0;      // token embedding (and untied LM head counted separately)
  int64_t lm_head = 0;        // 0 when tied
  int64_t non_embedding = 0;  // total - embedding - lm_head
  int64_t shift = 0;          // q_shift/k_shift/v_shift scalars
};
ParamCounts count_params(const ModelConfig& m);

}  // namespace kvs
