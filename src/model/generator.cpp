// One decoding block per layer, for n new tokens at positions t..t+n-1 (rows of n;
// a generated token is a block of 1, a prompt is cut into blocks of prefill_chunk):
//   ln = RMSNorm(x); q, k, v = ln Wq^T, ln Wk^T, ln Wv^T   (raw projections)
//   k̂ = Shift(raw k of t-W..t+n-1), v̂ likewise (shift_q: q too)
//   K̂[t..] = RoPE(k̂), V̂[t..] = v̂, q = RoPE(q)             (cache rows t..t+n-1)
//   x += Wo · softmax(q K̂[0..t+i]^T / sqrt(D)) V̂[0..t+i]   (row i: causal)
//   x += Wdown · SwiGLU(ln2 Wgate^T, ln2 Wup^T), ln2 = RMSNorm(x)
// then logits = RMSNorm(x) Wlm^T of the last row. The order and the ops are
// CpuEngine's (cpu_engine.cpp), so the logits agree with a full forward up to
// fp32 rounding.
#include "model/generator.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace kvs {

Generator::Generator(const ModelConfig& m, std::vector<float> params, int max_len, GeneratorOptions opt)
    : m_(m), layout_(ParamLayout::build(m)), params_(std::move(params)), max_len_(max_len), opt_(opt) {
  KVS_CHECK(params_.size() == layout_.total, "generate: {} parameters given, the model has {}", params_.size(),
            layout_.total);
  KVS_CHECK(max_len >= 1 && max_len <= m.max_position_embeddings,
            "generate: {} positions requested, the model's max_position_embeddings is {}", max_len,
            m.max_position_embeddings);
  KVS_CHECK(opt.prefill_chunk >= 1, "generate: prefill_chunk {} must be >= 1", opt.prefill_chunk);
  P_ = bind_params(layout_, m_, params_.data());
  // The cache bugs are bugs of a token-by-token cache: keep them that way.
  chunk_ = opt.history == ShiftHistory::Raw ? std::min(opt.prefill_chunk, max_len) : 1;
  const int L = m.num_hidden_layers, C = m.hidden_size, F = m.intermediate_size;
  const int Hq = m.num_attention_heads, Hkv = m.num_key_value_heads, D = m.head_dim();
  const size_t QD = m.q_dim(), KD = m.kv_dim(), W = m.kv_shift.window;
  const bool gated = m.kv_shift.sigmoid_gate();

  // "sigmoid_gate" stores a logit g in column 1; the coefficients are
  // [1 - sigmoid(g), sigmoid(g)] (window 1), fixed for a loaded model.
  gate_coef_.assign(gated ? static_cast<size_t>(L) * (Hq + 2 * Hkv) * 2 : 0, 0.0f);
  auto effective = [&](const float* stored, int H, size_t at) -> const float* {
    if (!stored || !gated) return stored;
    float* eff = gate_coef_.data() + at;
    cpu::shift_gate_forward(eff, stored, H);
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
    if (w.k_shift) c.kwin.assign((W + chunk_) * KD, 0.0f);
    if (w.v_shift) c.vwin.assign((W + chunk_) * KD, 0.0f);
    if (w.q_shift) c.qwin.assign((W + chunk_) * QD, 0.0f);
  }
  if (m.position_encoding == PositionEncoding::Rope) {
    rope_cos_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    rope_sin_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    cpu::rope_tables(rope_cos_.data(), rope_sin_.data(), max_len, D, m.rope_theta);
  }
  const size_t R = chunk_;
  x_.assign(R * C, 0.0f);
  ln_.assign(R * C, 0.0f);
  rstd_.assign(R, 0.0f);
  q_.assign(R * QD, 0.0f);
  att_.assign(R * QD, 0.0f);
  scores_.assign(static_cast<size_t>(Hq) * max_len, 0.0f);
  proj_.assign(R * C, 0.0f);
  gate_.assign(R * F, 0.0f);
  up_.assign(R * F, 0.0f);
  h_.assign(R * F, 0.0f);
  shift_out_.assign((W + R) * std::max(QD, KD), 0.0f);
  doc_.assign(R, 0);
  win_doc_.assign(W + R, 0);
  logits_.assign(m.vocab_size, 0.0f);
}

void Generator::reset() {
  pos_ = 0;
  doc_start_ = 0;
  for (LayerCache& c : cache_) {
    std::fill(c.kwin.begin(), c.kwin.end(), 0.0f);  // the shift's zeros before position 0
    std::fill(c.vwin.begin(), c.vwin.end(), 0.0f);
    std::fill(c.qwin.begin(), c.qwin.end(), 0.0f);
  }
}

void Generator::shift_block(std::vector<float>& win, const float* coef, int H, int n, float* out) {
  const int W = m_.kv_shift.window, D = m_.head_dim();
  const size_t row = static_cast<size_t>(H) * D;
  float* fresh = win.data() + W * row;  // the n new raw rows
  // Rows 0..W-1 only feed the new rows; their own outputs (which would see
  // zeros before them) are discarded.
  const bool docs = m_.document_boundaries != DocumentBoundaries::None;
  cpu::kv_shift_forward(shift_out_.data(), win.data(), coef, 1, W + n, H, D, W, docs ? win_doc_.data() : nullptr);
  std::copy(shift_out_.data() + W * row, shift_out_.data() + (W + n) * row, out);
  if (opt_.history == ShiftHistory::Mixed) std::copy(out, out + n * row, fresh);
  if (opt_.history == ShiftHistory::Zeros) std::fill(fresh, fresh + n * row, 0.0f);
  // Keep the last W rows as the window of the next block.
  std::memmove(win.data(), win.data() + n * row, W * row * sizeof(float));
}

// Causal attention of one query row over cache rows [first, end) (grouped-query:
// query head h reads KV head h / (Hq / Hkv)), scale 1/sqrt(D).
void Generator::attend(float* out, const float* q, const LayerCache& c, int first, int end) {
  const int Hq = m_.num_attention_heads, Hkv = m_.num_key_value_heads, D = m_.head_dim();
  const size_t KD = m_.kv_dim();
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Threads only pay off once the context is long.
#pragma omp parallel for schedule(static) if (static_cast<long>(end - first) * Hq * D > (1L << 16))
  for (int h = 0; h < Hq; ++h) {
    const float* qh = q + static_cast<size_t>(h) * D;
    const size_t koff = static_cast<size_t>(h / group) * D;
    float* s = scores_.data() + static_cast<size_t>(h) * max_len_;
    float mx = -INFINITY;
    for (int j = first; j < end; ++j) {
      const float* kr = c.khat.data() + j * KD + koff;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += qh[d] * kr[d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    float sum = 0.0f;
    for (int j = first; j < end; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
    float* oh = out + static_cast<size_t>(h) * D;
    std::fill(oh, oh + D, 0.0f);
    for (int j = first; j < end; ++j) {
      const float p = s[j] * inv;
      const float* vr = c.vhat.data() + j * KD + koff;
      for (int d = 0; d < D; ++d) oh[d] += p * vr[d];
    }
  }
}

const float* Generator::step(int32_t token) { return forward_block(&token, 1); }

const float* Generator::prefill(const std::vector<int32_t>& tokens) {
  KVS_CHECK(!tokens.empty(), "generate: empty prompt");
  const float* logits = nullptr;
  for (size_t i = 0; i < tokens.size(); i += chunk_)
    logits = forward_block(tokens.data() + i, static_cast<int>(std::min<size_t>(chunk_, tokens.size() - i)));
  return logits;
}

const float* Generator::forward_block(const int32_t* tokens, int n) {
  KVS_CHECK(pos_ + n <= max_len_, "generate: the KV cache is full ({} positions)", max_len_);
  for (int i = 0; i < n; ++i)
    KVS_CHECK(tokens[i] >= 0 && tokens[i] < m_.vocab_size,
              "generate: token {} at position {} is outside the vocabulary [0, {})", tokens[i], pos_ + i,
              m_.vocab_size);
  const int t = pos_, C = m_.hidden_size, F = m_.intermediate_size, V = m_.vocab_size;
  const int Hq = m_.num_attention_heads, Hkv = m_.num_key_value_heads, D = m_.head_dim();
  const int QD = m_.q_dim(), KD = m_.kv_dim(), W = m_.kv_shift.window;
  const size_t nC = static_cast<size_t>(n) * C, nF = static_cast<size_t>(n) * F;
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  // Tables row t is position t: the block's rows start at its first position.
  const float* cos = rope ? rope_cos_.data() + static_cast<size_t>(t) * (D / 2) : nullptr;
  const float* sin = rope ? rope_sin_.data() + static_cast<size_t>(t) * (D / 2) : nullptr;
  float* x = x_.data();
  float* ln = ln_.data();
  float* q = q_.data();

  // Documents (model.document_boundaries): a BOS starts one at its own position.
  if (m_.document_boundaries != DocumentBoundaries::None) {
    for (int i = 0; i < n; ++i) {
      if (tokens[i] == m_.bos_token_id) doc_start_ = t + i;
      doc_[i] = doc_start_;
    }
    // Window row r holds position t - W + r; rows before a document's start are zero history.
    for (int r = 0; r < W; ++r) win_doc_[r] = r;  // the past rows' own outputs are discarded
    for (int i = 0; i < n; ++i) win_doc_[W + i] = std::max(0, doc_[i] - (t - W));
  }
  const bool doc_attention = m_.document_boundaries == DocumentBoundaries::ShiftAndAttention;

  cpu::embedding_forward(x, tokens, P_.embed, n, C);
  for (int l = 0; l < m_.num_hidden_layers; ++l) {
    const LayerView& w = P_.layers[l];
    LayerCache& c = cache_[l];
    float* khat = c.khat.data() + static_cast<size_t>(t) * KD;  // cache rows t..t+n-1
    float* vhat = c.vhat.data() + static_cast<size_t>(t) * KD;

    cpu::rmsnorm_forward(ln, rstd_.data(), x, w.ln1, n, C, m_.rms_norm_eps);
    // Raw projections of shifted tensors go into their window, after its W past rows.
    if (w.q_shift) {
      cpu::matmul_forward(c.qwin.data() + static_cast<size_t>(W) * QD, ln, w.wq, n, C, QD);
      shift_block(c.qwin, c.qc, Hq, n, q);
    } else {
      cpu::matmul_forward(q, ln, w.wq, n, C, QD);
    }
    if (w.k_shift) {
      cpu::matmul_forward(c.kwin.data() + static_cast<size_t>(W) * KD, ln, w.wk, n, C, KD);
      shift_block(c.kwin, c.kc, Hkv, n, khat);  // pre-RoPE here; rotated below
    } else {
      cpu::matmul_forward(khat, ln, w.wk, n, C, KD);
    }
    if (w.v_shift) {
      cpu::matmul_forward(c.vwin.data() + static_cast<size_t>(W) * KD, ln, w.wv, n, C, KD);
      shift_block(c.vwin, c.vc, Hkv, n, vhat);
    } else {
      cpu::matmul_forward(vhat, ln, w.wv, n, C, KD);
    }
    // RoPE after the shift, at each row's position.
    if (rope) {
      cpu::rope_forward(khat, khat, cos, sin, 1, n, Hkv, D);
      cpu::rope_forward(q, q, cos, sin, 1, n, Hq, D);
    }
    for (int i = 0; i < n; ++i)
      attend(att_.data() + static_cast<size_t>(i) * QD, q + static_cast<size_t>(i) * QD, c, doc_attention ? doc_[i] : 0,
             t + i + 1);
    cpu::matmul_forward(proj_.data(), att_.data(), w.wo, n, QD, C);
    cpu::residual_forward(x, x, proj_.data(), nC);

    cpu::rmsnorm_forward(ln, rstd_.data(), x, w.ln2, n, C, m_.rms_norm_eps);
    cpu::matmul_forward(gate_.data(), ln, w.w_gate, n, C, F);
    cpu::matmul_forward(up_.data(), ln, w.w_up, n, C, F);
    cpu::swiglu_forward(h_.data(), gate_.data(), up_.data(), nF);
    cpu::matmul_forward(proj_.data(), h_.data(), w.w_down, n, F, C);
    cpu::residual_forward(x, x, proj_.data(), nC);
  }
  // Only the last row's next token is asked for.
  const float* last = x + static_cast<size_t>(n - 1) * C;
  cpu::rmsnorm_forward(ln, rstd_.data(), last, P_.norm, 1, C, m_.rms_norm_eps);
  cpu::matmul_forward(logits_.data(), ln, P_.lm_head, 1, C, V);
  pos_ += n;
  return logits_.data();
}

}  // namespace kvs
