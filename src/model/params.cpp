#include "model/params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

ParamLayout ParamLayout::build(const ModelConfig& m, int tp_rank, int tp, const ModelPart* part) {
  KVS_CHECK(tp >= 1 && tp_rank >= 0 && tp_rank < tp, "ParamLayout: tensor-parallel rank {} of {}", tp_rank, tp);
  ParamLayout L;
  // full: the whole tensor's shape; split_dim: cut into tp equal slices along it (-1: replicated).
  auto add = [&](std::string name, std::vector<int64_t> full, int split_dim, ParamKind kind) {
    ParamTensor t;
    t.name = std::move(name);
    t.full_shape = full;
    t.shape = std::move(full);
    t.split_dim = split_dim;
    if (split_dim >= 0) {
      int64_t& d = t.shape[split_dim];
      if (kind == ParamKind::Embedding || t.name == "lm_head.weight") d = padded_vocab(m, tp);
      KVS_CHECK(d % tp == 0, "ParamLayout: {} dimension {} ({}) does not split into {} ranks", t.name, split_dim, d, tp);
      d /= tp;
    }
    t.numel = 1;
    for (auto d : t.shape) t.numel *= static_cast<size_t>(d);
    t.offset = L.total;
    t.kind = kind;
    L.total += t.numel;
    L.tensors.push_back(std::move(t));
  };
  const int64_t C = m.hidden_size, F = m.intermediate_size, V = m.vocab_size;
  const int64_t QD = m.q_dim(), KD = m.kv_dim(), HKV = m.num_key_value_heads;
  const int64_t W1 = m.kv_shift.window + 1;
  const bool shift_k = m.kv_shift.enabled && m.kv_shift.shift_k;
  const bool shift_v = m.kv_shift.enabled && m.kv_shift.shift_v;
  const bool shift_q = m.kv_shift.enabled && m.kv_shift.shift_q;
  const int64_t HQ = m.num_attention_heads;
  constexpr int kRows = 0, kCols = 1, kReplicated = -1;
  const bool embed = !part || part->embedding || (part->head && m.tie_word_embeddings);
  const bool head = !part || part->head;
  if (embed) add("model.embed_tokens.weight", {V, C}, kRows, ParamKind::Embedding);
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    if (part && !part->holds(i)) continue;
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {C}, kReplicated, ParamKind::Norm);
    add(p + "self_attn.q_proj.weight", {QD, C}, kRows, ParamKind::Matrix);
    add(p + "self_attn.k_proj.weight", {KD, C}, kRows, ParamKind::Matrix);
    add(p + "self_attn.v_proj.weight", {KD, C}, kRows, ParamKind::Matrix);
    add(p + "self_attn.o_proj.weight", {C, QD}, kCols, ParamKind::Matrix);
    if (shift_k) add(p + "self_attn.k_shift", {HKV, W1}, kRows, ParamKind::Shift);
    if (shift_v) add(p + "self_attn.v_shift", {HKV, W1}, kRows, ParamKind::Shift);
    if (shift_q) add(p + "self_attn.q_shift", {HQ, W1}, kRows, ParamKind::Shift);
    add(p + "post_attention_layernorm.weight", {C}, kReplicated, ParamKind::Norm);
    add(p + "mlp.gate_proj.weight", {F, C}, kRows, ParamKind::Matrix);
    add(p + "mlp.up_proj.weight", {F, C}, kRows, ParamKind::Matrix);
    add(p + "mlp.down_proj.weight", {C, F}, kCols, ParamKind::Matrix);
  }
  if (head) add("model.norm.weight", {C}, kReplicated, ParamKind::Norm);
  if (head && !m.tie_word_embeddings) add("lm_head.weight", {V, C}, kRows, ParamKind::Matrix);
  return L;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

ModelView bind_params(const ParamLayout& layout, const ModelConfig& m, float* base) {
  auto at = [&](const std::string& name) -> float* {
    const ParamTensor* t = layout.find(name);
    return t ? base + t->offset : nullptr;
  };
  ModelView v;
  v.embed = at("model.embed_tokens.weight");
  for (int i = 0; i < m.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    LayerView l;
    l.ln1 = at(p + "input_layernorm.weight");
    l.wq = at(p + "self_attn.q_proj.weight");
    l.wk = at(p + "self_attn.k_proj.weight");
    l.wv = at(p + "self_attn.v_proj.weight");
    l.wo = at(p + "self_attn.o_proj.weight");
    l.q_shift = at(p + "self_attn.q_shift");
    l.k_shift = at(p + "self_attn.k_shift");
    l.v_shift = at(p + "self_attn.v_shift");
    l.ln2 = at(p + "post_attention_layernorm.weight");
    l.w_gate = at(p + "mlp.gate_proj.weight");
    l.w_up = at(p + "mlp.up_proj.weight");
    l.w_down = at(p + "mlp.down_proj.weight");
    v.layers.push_back(l);
  }
  v.norm = at("model.norm.weight");
  v.lm_head = m.tie_word_embeddings ? v.embed : at("lm_head.weight");
  return v;
}

void init_param_range(const ParamTensor& t, const ModelConfig& m, uint64_t seed, size_t first, size_t n, float* out) {
  KVS_CHECK(first <= t.numel && n <= t.numel - first, "init: elements [{}, {}) of {} are outside its {}", first,
            first + n, t.name, t.numel);
  const uint64_t s = mix_seed(seed, hash_name(t.name));
  switch (t.kind) {
    case ParamKind::Embedding:
    case ParamKind::Matrix:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(m.initializer_range * normal01(s, first + i));
      return;
    case ParamKind::Norm:
      std::fill(out, out + n, 1.0f);
      return;
    case ParamKind::Shift:
      break;
  }
  // A few scalars per head, and each head's values depend on each other: the
  // whole tensor is made and the range copied out.
  std::vector<float> p(t.numel);
  // [H, W+1], oldest first. The paper's footnote 14: the W older columns
  // ~ U(0,1) independently, current = 1 - their sum, so the mix starts as
  // a sum of coefficients 1 (window 1: prev ~ U(0,1), cur = 1 - prev).
  // Draw index h*W + w keeps window 1's values what they always were.
  const int64_t W = t.shape[1] - 1;
  if (m.kv_shift.sigmoid_gate()) {
    // [unused = 0, gate logit g]: sigmoid(g) = cur = 1 - u, prev = u (same u as "free").
    for (int64_t h = 0; h < t.shape[0]; ++h) {
      const double u = std::clamp(uniform01(s, static_cast<uint64_t>(h)), 1e-4, 1.0 - 1e-4);
      p[h * 2 + 0] = 0.0f;
      p[h * 2 + 1] = static_cast<float>(std::log((1.0 - u) / u));
    }
  } else {
    for (int64_t h = 0; h < t.shape[0]; ++h) {
      float* row = p.data() + h * (W + 1);
      float older = 0.0f;
      for (int64_t w = 0; w < W; ++w) {
        row[w] = static_cast<float>(uniform01(s, static_cast<uint64_t>(h * W + w)));
        older += row[w];
      }
      row[W] = 1.0f - older;
    }
  }
  std::copy_n(p.begin() + static_cast<std::ptrdiff_t>(first), n, out);
}

void init_params(const ParamLayout& layout, const ModelConfig& m, uint64_t seed, float* base) {
  for (const auto& t : layout.tensors) init_param_range(t, m, seed, 0, t.numel, base + t.offset);
}

ParamCounts count_params(const ModelConfig& m) {
  ParamCounts c;
  for (const auto& t : ParamLayout::build(m).tensors) {
    const auto n = static_cast<int64_t>(t.numel);
    if (t.kind == ParamKind::Shift) {
      c.shift += n;
      continue;
    }
    c.total += n;
    if (t.kind == ParamKind::Embedding) c.embedding += n;
    if (t.name == "lm_head.weight") c.lm_head += n;
  }
  c.non_embedding = c.total - c.embedding - c.lm_head;
  return c;
}

}  // namespace kvs
