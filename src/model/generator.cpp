// One decoding step per layer, for the token at position t (rows of 1):
//   ln = RMSNorm(x); q, k, v = ln Wq^T, ln Wk^T, ln Wv^T   (raw projections)
//   k̂ = Shift(raw k of t-W..t), v̂ = Shift(raw v of t-W..t)  (shift_q: q too)
//   K̂[t] = RoPE_t(k̂), V̂[t] = v̂, q = RoPE_t(q)              (cache rows t)
//   x += Wo · softmax(q K̂[0..t]^T / sqrt(D)) V̂[0..t]
//   x += Wdown · SwiGLU(ln2 Wgate^T, ln2 Wup^T), ln2 = RMSNorm(x)
// then logits = RMSNorm(x) Wlm^T. The order and the ops are CpuEngine's
// (cpu_engine.cpp), so the logits agree with a full forward up to fp32 rounding.
#include "model/generator.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace kvs {

Generator::Generator(const ModelConfig& m, std::vector<float> params, int max_len, ShiftHistory history)
    : m_(m), layout_(ParamLayout::build(m)), params_(std::move(params)), max_len_(max_len), history_(history) {
  KVS_CHECK(params_.size() == layout_.total, "generate: {} parameters given, the model has {}", params_.size(),
            layout_.total);
  KVS_CHECK(max_len >= 1 && max_len <= m.max_position_embeddings,
            "generate: {} positions requested, the model's max_position_embeddings is {}", max_len,
            m.max_position_embeddings);
  KVS_CHECK(m.position_encoding == "rope" || m.position_encoding == "none",
            "generate: unknown position_encoding '{}'", m.position_encoding);
  P_ = bind_params(layout_, m_, params_.data());
  const int L = m.num_hidden_layers, C = m.hidden_size, F = m.intermediate_size;
  const int Hq = m.num_attention_heads, Hkv = m.num_key_value_heads, D = m.head_dim();
  const size_t QD = m.q_dim(), KD = m.kv_dim(), W1 = static_cast<size_t>(m.kv_shift.window) + 1;
  const bool gated = m.kv_shift.sigmoid_gate();

  // "sigmoid_gate" stores a logit g in column 1; the coefficients are
  // [1 - sigmoid(g), sigmoid(g)] (window 1), fixed for a loaded model.
  gate_coef_.assign(gated ? static_cast<size_t>(L) * (Hq + 2 * Hkv) * 2 : 0, 0.0f);
  auto effective = [&](const float* stored, int H, size_t at) -> const float* {
    if (!stored || !gated) return stored;
    float* eff = gate_coef_.data() + at;
    for (int h = 0; h < H; ++h) {
      const float s = 1.0f / (1.0f + std::exp(-stored[h * 2 + 1]));
      eff[h * 2 + 0] = 1.0f - s;
      eff[h * 2 + 1] = s;
    }
    return eff;
  };
  cache_.resize(L);
  for (int l = 0; l < L; ++l) {
    LayerCache& c = cache_[l];
    const LayerView& w = P_.layers[l];
    const size_t base = static_cast<size_t>(l) * (Hq + 2 * Hkv) * 2;
    c.qc = effective(w.q_shift, Hq, base);
    c.kc = effective(w.k_shift, Hkv, base + Hq * 2);
    c.vc = effective(w.v_shift, Hkv, base + (Hq + Hkv) * 2);
    c.khat.assign(static_cast<size_t>(max_len) * KD, 0.0f);
    c.vhat.assign(static_cast<size_t>(max_len) * KD, 0.0f);
    if (w.k_shift) c.kwin.assign(W1 * KD, 0.0f);
    if (w.v_shift) c.vwin.assign(W1 * KD, 0.0f);
    if (w.q_shift) c.qwin.assign(W1 * QD, 0.0f);
  }
  if (m.position_encoding == "rope") {
    rope_cos_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    rope_sin_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    cpu::rope_tables(rope_cos_.data(), rope_sin_.data(), max_len, D, m.rope_theta);
  }
  x_.assign(C, 0.0f);
  ln_.assign(C, 0.0f);
  rstd_.assign(1, 0.0f);
  q_.assign(QD, 0.0f);
  k_.assign(KD, 0.0f);
  v_.assign(KD, 0.0f);
  att_.assign(QD, 0.0f);
  scores_.assign(static_cast<size_t>(Hq) * max_len, 0.0f);
  proj_.assign(C, 0.0f);
  gate_.assign(F, 0.0f);
  up_.assign(F, 0.0f);
  h_.assign(F, 0.0f);
  shift_out_.assign(W1 * std::max(QD, KD), 0.0f);
  logits_.assign(m.vocab_size, 0.0f);
}

void Generator::reset() {
  pos_ = 0;
  for (LayerCache& c : cache_) {
    std::fill(c.kwin.begin(), c.kwin.end(), 0.0f);  // the shift's zeros before position 0
    std::fill(c.vwin.begin(), c.vwin.end(), 0.0f);
    std::fill(c.qwin.begin(), c.qwin.end(), 0.0f);
  }
}

const float* Generator::shift_row(std::vector<float>& win, const float* coef, int H) {
  const int W = m_.kv_shift.window, D = m_.head_dim();
  const size_t row = win.size() / (W + 1);
  cpu::kv_shift_forward(shift_out_.data(), win.data(), coef, 1, W + 1, H, D, W);
  return shift_out_.data() + W * row;  // only the last row sees the whole window
}

void Generator::slide(std::vector<float>& win, const float* shifted, size_t row) {
  const int W = m_.kv_shift.window;
  float* cur = win.data() + W * row;
  if (history_ == ShiftHistory::Mixed) std::copy(shifted, shifted + row, cur);
  if (history_ == ShiftHistory::Zeros) std::fill(cur, cur + row, 0.0f);
  std::memmove(win.data(), win.data() + row, W * row * sizeof(float));
}

// Causal attention of one query row over cache rows 0..n-1 (grouped-query:
// query head h reads KV head h / (Hq / Hkv)), scale 1/sqrt(D).
void Generator::attend(float* out, const float* q, const LayerCache& c, int n) {
  const int Hq = m_.num_attention_heads, Hkv = m_.num_key_value_heads, D = m_.head_dim();
  const size_t KD = m_.kv_dim();
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Threads only pay off once the context is long.
#pragma omp parallel for schedule(static) if (static_cast<long>(n) * Hq * D > (1L << 16))
  for (int h = 0; h < Hq; ++h) {
    const float* qh = q + static_cast<size_t>(h) * D;
    const size_t koff = static_cast<size_t>(h / group) * D;
    float* s = scores_.data() + static_cast<size_t>(h) * max_len_;
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
      const float* kr = c.khat.data() + j * KD + koff;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += qh[d] * kr[d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    float* oh = out + static_cast<size_t>(h) * D;
    std::fill(oh, oh + D, 0.0f);
    for (int j = 0; j < n; ++j) {
      const float p = s[j] * inv;
      const float* vr = c.vhat.data() + j * KD + koff;
      for (int d = 0; d < D; ++d) oh[d] += p * vr[d];
    }
  }
}

const float* Generator::step(int32_t token) {
  KVS_CHECK(pos_ < max_len_, "generate: the KV cache is full ({} positions)", max_len_);
  KVS_CHECK(token >= 0 && token < m_.vocab_size, "generate: token {} at position {} is outside the vocabulary [0, {})",
            token, pos_, m_.vocab_size);
  const int t = pos_, C = m_.hidden_size, F = m_.intermediate_size, V = m_.vocab_size;
  const int Hq = m_.num_attention_heads, Hkv = m_.num_key_value_heads, D = m_.head_dim();
  const int QD = m_.q_dim(), KD = m_.kv_dim(), W = m_.kv_shift.window;
  const bool rope = m_.position_encoding == "rope";
  const float* cos = rope ? rope_cos_.data() + static_cast<size_t>(t) * (D / 2) : nullptr;
  const float* sin = rope ? rope_sin_.data() + static_cast<size_t>(t) * (D / 2) : nullptr;
  float* x = x_.data();
  float* ln = ln_.data();

  cpu::embedding_forward(x, &token, P_.embed, 1, C);
  for (int l = 0; l < m_.num_hidden_layers; ++l) {
    const LayerView& w = P_.layers[l];
    LayerCache& c = cache_[l];
    float* khat = c.khat.data() + static_cast<size_t>(t) * KD;
    float* vhat = c.vhat.data() + static_cast<size_t>(t) * KD;

    cpu::rmsnorm_forward(ln, rstd_.data(), x, w.ln1, 1, C, m_.rms_norm_eps);
    // Raw projections go straight into row W of their shift window.
    if (w.q_shift) {
      cpu::matmul_forward(c.qwin.data() + static_cast<size_t>(W) * QD, ln, w.wq, 1, C, QD);
      const float* qs = shift_row(c.qwin, c.qc, Hq);
      std::copy(qs, qs + QD, q_.data());
      slide(c.qwin, qs, QD);
    } else {
      cpu::matmul_forward(q_.data(), ln, w.wq, 1, C, QD);
    }
    if (w.k_shift) {
      cpu::matmul_forward(c.kwin.data() + static_cast<size_t>(W) * KD, ln, w.wk, 1, C, KD);
      const float* ks = shift_row(c.kwin, c.kc, Hkv);
      std::copy(ks, ks + KD, khat);  // pre-RoPE here; rotated below
      slide(c.kwin, ks, KD);
    } else {
      cpu::matmul_forward(khat, ln, w.wk, 1, C, KD);
    }
    if (w.v_shift) {
      cpu::matmul_forward(c.vwin.data() + static_cast<size_t>(W) * KD, ln, w.wv, 1, C, KD);
      const float* vs = shift_row(c.vwin, c.vc, Hkv);
      std::copy(vs, vs + KD, vhat);
      slide(c.vwin, vs, KD);
    } else {
      cpu::matmul_forward(vhat, ln, w.wv, 1, C, KD);
    }
    // RoPE after the shift, at this position's angle.
    if (rope) {
      cpu::rope_forward(khat, khat, cos, sin, 1, 1, Hkv, D);
      cpu::rope_forward(q_.data(), q_.data(), cos, sin, 1, 1, Hq, D);
    }
    attend(att_.data(), q_.data(), c, t + 1);
    cpu::matmul_forward(proj_.data(), att_.data(), w.wo, 1, QD, C);
    cpu::residual_forward(x, x, proj_.data(), C);

    cpu::rmsnorm_forward(ln, rstd_.data(), x, w.ln2, 1, C, m_.rms_norm_eps);
    cpu::matmul_forward(gate_.data(), ln, w.w_gate, 1, C, F);
    cpu::matmul_forward(up_.data(), ln, w.w_up, 1, C, F);
    cpu::swiglu_forward(h_.data(), gate_.data(), up_.data(), F);
    cpu::matmul_forward(proj_.data(), h_.data(), w.w_down, 1, F, C);
    cpu::residual_forward(x, x, proj_.data(), C);
  }
  cpu::rmsnorm_forward(ln, rstd_.data(), x, P_.norm, 1, C, m_.rms_norm_eps);
  cpu::matmul_forward(logits_.data(), ln, P_.lm_head, 1, C, V);
  ++pos_;
  return logits_.data();
}

const float* Generator::prefill(const std::vector<int32_t>& tokens) {
  KVS_CHECK(!tokens.empty(), "generate: empty prompt");
  const float* logits = nullptr;
  for (int32_t tok : tokens) logits = step(tok);
  return logits;
}

}  // namespace kvs
