// Decoding blocks of n new tokens at positions t..t+n-1 (a generated token is
// a block of 1, a prompt is cut into blocks of prefill_chunk): every layer is
// block_forward (model/cpu_block.h), CpuEngine's layer, with the block's rows
// at positions t.. (RoPE and the causal mask), the layer's halo as the shift's
// history and the cache rows 0..t-1 before the new K̂/V̂ rows as attention's
// past; then logits = RMSNorm(x) Wlm^T of the last row. So the logits agree
// with a full forward up to fp32 rounding.
#include "model/generator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "model/cpu_block.h"
#include "model/rope_frequencies.h"

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
  cache_.resize(L);
  for (int l = 0; l < L; ++l) {
    LayerCache& c = cache_[l];
    const LayerView& w = P_.layers[l];
    c.khat.assign(static_cast<size_t>(max_len) * KD, 0.0f);
    c.vhat.assign(static_cast<size_t>(max_len) * KD, 0.0f);
    if (w.q_shift) c.qhalo.assign(W * QD, 0.0f);
    if (w.k_shift) c.khalo.assign(W * KD, 0.0f);
    if (w.v_shift) c.vhalo.assign(W * KD, 0.0f);
  }
  if (m.position_encoding == PositionEncoding::Rope) {
    rope_cos_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    rope_sin_.assign(static_cast<size_t>(max_len) * D / 2, 0.0f);
    cpu::rope_tables(rope_cos_.data(), rope_sin_.data(), max_len, D, rope_frequencies(m));
  }
  const size_t R = chunk_;
  for (auto* buf : {&x_, &mid_, &ln_}) buf->assign(R * C, 0.0f);
  rstd_.assign(R, 0.0f);
  for (auto* buf : {&qraw_, &q_, &attout_}) buf->assign(R * QD, 0.0f);
  for (auto* buf : {&kraw_, &vraw_}) buf->assign(R * KD, 0.0f);
  att_.assign(static_cast<size_t>(Hq) * R * max_len, 0.0f);
  gate_up_.assign(R * 2 * F, 0.0f);
  h_.assign(R * F, 0.0f);
  coef_.assign((static_cast<size_t>(Hq) + 2 * Hkv) * (W + 1), 0.0f);
  doc_.assign(R, 0);
  row_doc_.assign(R, 0);
  logits_.assign(m.vocab_size, 0.0f);
}

void Generator::reset() {
  pos_ = 0;
  doc_start_ = 0;
  for (LayerCache& c : cache_)
    for (auto* halo : {&c.qhalo, &c.khalo, &c.vhalo}) std::fill(halo->begin(), halo->end(), 0.0f);
}

void Generator::advance(std::vector<float>& halo, const float* rows, int n, size_t row) const {
  if (halo.empty() || opt_.history == ShiftHistory::Zeros) return;
  const size_t W = m_.kv_shift.window;
  const size_t keep = n < static_cast<int>(W) ? W - n : 0;  // halo rows that stay, moved to the front
  std::memmove(halo.data(), halo.data() + (W - keep) * row, keep * row * sizeof(float));
  std::memcpy(halo.data() + keep * row, rows + (n - (W - keep)) * row, (W - keep) * row * sizeof(float));
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
  const int t = pos_, C = m_.hidden_size, V = m_.vocab_size;
  const size_t QD = m_.q_dim(), KD = m_.kv_dim();
  const bool docs = m_.document_boundaries != DocumentBoundaries::None;
  // Documents: a BOS starts one at its own position.
  if (docs) {
    for (int i = 0; i < n; ++i) {
      if (tokens[i] == m_.bos_token_id) doc_start_ = t + i;
      doc_[i] = doc_start_;
      row_doc_[i] = doc_start_ - t;  // <= -W: the document goes on through the whole halo
    }
  }
  BlockContext ctx;
  ctx.B = 1;
  ctx.T = n;
  ctx.d = LocalDims::of(m_, 0, 1);
  ctx.window = m_.kv_shift.window;
  ctx.rope = m_.position_encoding == PositionEncoding::Rope;
  ctx.sigmoid_gate = m_.kv_shift.sigmoid_gate();
  ctx.eps = m_.rms_norm_eps;
  ctx.rope_cos = rope_cos_.data();
  ctx.rope_sin = rope_sin_.data();
  ctx.pos0 = t;
  ctx.kv_past = t;
  ctx.shift_doc = docs ? row_doc_.data() : nullptr;
  ctx.attention_doc = m_.document_boundaries == DocumentBoundaries::ShiftAndAttention ? doc_.data() : nullptr;

  float* x = x_.data();
  cpu::embedding_forward(x, tokens, P_.embed, n, C);
  for (int l = 0; l < m_.num_hidden_layers; ++l) {
    const LayerView& w = P_.layers[l];
    LayerCache& c = cache_[l];
    ctx.q_halo = w.q_shift ? c.qhalo.data() : nullptr;
    ctx.k_halo = w.k_shift ? c.khalo.data() : nullptr;
    ctx.v_halo = w.v_shift ? c.vhalo.data() : nullptr;
    LayerActs a{};
    a.resid = a.out = x;  // the block's rows, updated in place
    a.res_mid = mid_.data();
    a.ln1 = a.ln2 = ln_.data();
    a.rstd1 = a.rstd2 = rstd_.data();
    a.qraw = qraw_.data();
    a.q = q_.data();
    a.khat = c.khat.data() + static_cast<size_t>(t) * KD;  // cache rows t..t+n-1
    a.vhat = c.vhat.data() + static_cast<size_t>(t) * KD;
    a.k = kraw_.data();
    a.v = w.v_shift ? vraw_.data() : a.vhat;  // unshifted: the projection is V̂ itself
    a.att = att_.data();
    a.attout = attout_.data();
    a.gate_up = gate_up_.data();
    a.h = h_.data();
    a.coef = coef_.data();
    block_forward(w, a, ctx);
    // The shift's history for the next block: the raw rows (or, as the
    // negative controls, what the cache keeps, or nothing).
    const bool mixed = opt_.history == ShiftHistory::Mixed;
    advance(c.qhalo, mixed ? a.q : a.qraw, n, QD);
    advance(c.khalo, mixed ? a.khat : a.k, n, KD);
    advance(c.vhalo, mixed ? a.vhat : a.v, n, KD);
  }
  // Only the last row's next token is asked for.
  const float* last = x + static_cast<size_t>(n - 1) * C;
  cpu::rmsnorm_forward(ln_.data(), rstd_.data(), last, P_.norm, 1, C, m_.rms_norm_eps);
  cpu::matmul_forward(logits_.data(), ln_.data(), P_.lm_head, 1, C, V);
  pos_ += n;
  return logits_.data();
}

}  // namespace kvs
