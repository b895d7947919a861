// The CPU reference engine: the embedding, the decoder layers of
// model/cpu_block.h one by one, the final norm, the LM head and the masked
// cross-entropy, on one activation buffer planned in the constructor.
#include "model/cpu_engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/profile_range.h"
#include "dist/comm.h"
#include "kernels/cpu/ops.h"
#include "model/rope_frequencies.h"
#include "parallel/linear.h"
#include "parallel/vocab_parallel_loss.h"

namespace kvs {

namespace {
void zero(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }
}  // namespace

ActivationPlan ActivationPlan::build(const ModelConfig& m, const LocalDims& d, int B, int T) {
  ActivationPlan p;
  const size_t N = static_cast<size_t>(B) * T, L = m.num_hidden_layers, C = d.C;
  const size_t QD = d.QD(), KD = d.KD(), F = d.F, V = d.V;
  const size_t H = d.Hq, D = d.D;
  size_t off = 0;
  auto take = [&](size_t n) {
    size_t at = off;
    off += (n + 15) / 16 * 16;  // 64-byte aligned slices
    return at;
  };
  p.resid_stride = N * C;
  p.res_mid_stride = N * C;
  p.ln_stride = N * C;
  p.rstd_stride = N;
  p.q_stride = N * QD;
  p.kv_stride = N * KD;
  p.att_stride = static_cast<size_t>(B) * H * T * T;
  p.ffn_stride = N * F;
  const bool shift_q = m.kv_shift.enabled && m.kv_shift.shift_q;
  p.qraw_stride = shift_q ? N * QD : 0;
  p.coef_stride = (H + 2 * static_cast<size_t>(d.Hkv)) * (m.kv_shift.window + 1);
  p.resid = take((L + 1) * p.resid_stride);
  p.res_mid = take(L * p.res_mid_stride);
  p.ln1 = take(L * p.ln_stride);
  p.rstd1 = take(L * p.rstd_stride);
  p.q = take(L * p.q_stride);
  p.qraw = take(L * p.qraw_stride);
  p.coef = take(L * p.coef_stride);
  p.k = take(L * p.kv_stride);
  p.v = take(L * p.kv_stride);
  p.khat = take(L * p.kv_stride);
  p.vhat = take(L * p.kv_stride);
  p.att = take(L * p.att_stride);
  p.attout = take(L * p.q_stride);
  p.ln2 = take(L * p.ln_stride);
  p.rstd2 = take(L * p.rstd_stride);
  p.gate = take(L * p.ffn_stride);
  p.up = take(L * p.ffn_stride);
  p.h = take(L * p.ffn_stride);
  p.lnf = take(N * C);
  p.rstdf = take(N);
  p.logits = take(N * V);
  p.losses = take(N);
  p.rope_cos = take(static_cast<size_t>(T) * D / 2);
  p.rope_sin = take(static_cast<size_t>(T) * D / 2);
  p.dresid = take(N * C);
  p.dln = take(N * C);
  p.dh = take(N * F);
  p.dgate = take(N * F);
  p.dup = take(N * F);
  p.dattout = take(N * QD);
  p.dq = take(N * QD);
  p.dq_pre = take(N * QD);
  p.dkhat = take(N * KD);
  p.dks = take(N * KD);
  p.dk = take(N * KD);
  p.dvhat = take(N * KD);
  p.dv = take(N * KD);
  p.datt = take(p.att_stride);
  p.dqs = take(p.qraw_stride);
  p.dcoef = take(p.coef_stride);
  p.total = off;
  p.v_shifted = m.kv_shift.enabled && m.kv_shift.shift_v;
  return p;
}

LayerActs ActivationPlan::layer(float* a, int l) const {
  const size_t L = l;
  LayerActs x;
  x.resid = a + resid + L * resid_stride;
  x.res_mid = a + res_mid + L * res_mid_stride;
  x.out = a + resid + (L + 1) * resid_stride;
  x.ln1 = a + ln1 + L * ln_stride;
  x.rstd1 = a + rstd1 + L * rstd_stride;
  x.ln2 = a + ln2 + L * ln_stride;
  x.rstd2 = a + rstd2 + L * rstd_stride;
  x.qraw = qraw_stride ? a + qraw + L * qraw_stride : nullptr;
  x.q = a + q + L * q_stride;
  x.k = a + k + L * kv_stride;
  x.v = a + v + L * kv_stride;
  x.khat = a + khat + L * kv_stride;
  x.vhat = v_shifted ? a + vhat + L * kv_stride : x.v;
  x.att = a + att + L * att_stride;
  x.attout = a + attout + L * q_stride;
  x.gate = a + gate + L * ffn_stride;
  x.up = a + up + L * ffn_stride;
  x.h = a + h + L * ffn_stride;
  x.coef = a + coef + L * coef_stride;
  return x;
}

LayerScratch ActivationPlan::scratch(float* a) const {
  return {a + dln, a + dh, a + dgate, a + dup, a + dattout, a + dq, a + dq_pre, a + dkhat,
          a + dks, a + dk, a + dvhat, a + dv, a + datt, a + dqs, a + dcoef};
}

CpuEngine::CpuEngine(const ModelConfig& m, int max_batch, int max_seq_len, TensorParallel tp)
    : m_(m),
      tp_(tp),
      region_(tp),
      d_(LocalDims::of(m, tp.rank, tp.size)),
      layout_(ParamLayout::build(m, tp.rank, tp.size)),
      max_B_(max_batch),
      max_T_(max_seq_len) {
  KVS_CHECK(max_batch >= 1 && max_seq_len >= 1, "engine: batch and sequence length must be positive");
  KVS_CHECK(tp.size == 1 || (tp.comm && tp.comm->size() == tp.size && tp.comm->rank() == tp.rank),
            "engine: tensor-parallel rank {} of {} needs a communicator of that size and rank", tp.rank, tp.size);
  check_tensor_parallel(m, tp.size, "engine");
  plan_ = ActivationPlan::build(m, d_, max_batch, max_seq_len);
  params_.assign(layout_.total, 0.0f);
  grads_.assign(layout_.total, 0.0f);
  exp_avg_.assign(layout_.total, 0.0f);
  exp_avg_sq_.assign(layout_.total, 0.0f);
  opt_end_ = layout_.total;
  acts_.assign(plan_.total, 0.0f);
  argmax_.assign(static_cast<size_t>(max_batch) * max_seq_len, 0);
  if (m_.document_boundaries != DocumentBoundaries::None) doc_start_.assign(static_cast<size_t>(max_batch) * max_seq_len, 0);
  P_ = bind_params(layout_, m_, params_.data());
  G_ = bind_params(layout_, m_, grads_.data());
  cpu::rope_tables(acts_.data() + plan_.rope_cos, acts_.data() + plan_.rope_sin, max_T_, m_.head_dim(),
                   rope_frequencies(m_));
}

void CpuEngine::read_params(float* host) const { std::copy(params_.begin(), params_.end(), host); }
void CpuEngine::write_params(const float* host) { std::copy(host, host + layout_.total, params_.begin()); }
void CpuEngine::read_grads(float* host) const { std::copy(grads_.begin(), grads_.end(), host); }
void CpuEngine::read_optimizer_state(float* m, float* v) const {
  std::fill(m, m + layout_.total, 0.0f);
  std::fill(v, v + layout_.total, 0.0f);
  std::copy(exp_avg_.begin(), exp_avg_.end(), m + opt_begin_);
  std::copy(exp_avg_sq_.begin(), exp_avg_sq_.end(), v + opt_begin_);
}
void CpuEngine::write_optimizer_state(const float* m, const float* v) {
  std::copy(m + opt_begin_, m + opt_end_, exp_avg_.begin());
  std::copy(v + opt_begin_, v + opt_end_, exp_avg_sq_.begin());
}

void CpuEngine::keep_optimizer_range(size_t begin, size_t end) {
  KVS_CHECK(opt_begin_ <= begin && begin <= end && end <= opt_end_,
            "keep_optimizer_range: [{}, {}) is not inside the moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  std::vector<float> m(exp_avg_.begin() + (begin - opt_begin_), exp_avg_.begin() + (end - opt_begin_));
  std::vector<float> v(exp_avg_sq_.begin() + (begin - opt_begin_), exp_avg_sq_.begin() + (end - opt_begin_));
  exp_avg_.swap(m);  // the old, larger buffers are freed here
  exp_avg_sq_.swap(v);
  opt_begin_ = begin;
  opt_end_ = end;
}
void CpuEngine::zero_grad() { zero(grads_.data(), grads_.size()); }

BlockContext CpuEngine::block_context(int B, int T) const {
  BlockContext c;
  c.B = B;
  c.T = T;
  c.d = d_;
  c.window = m_.kv_shift.window;
  c.rope = m_.position_encoding == PositionEncoding::Rope;  // else q and k-hat enter attention unrotated
  c.sigmoid_gate = m_.kv_shift.sigmoid_gate();
  c.eps = m_.rms_norm_eps;
  c.rope_cos = acts_.data() + plan_.rope_cos;
  c.rope_sin = acts_.data() + plan_.rope_sin;
  c.shift_doc = shift_doc_start();
  c.attention_doc = attention_doc_start();
  c.tp = region_;
  return c;
}

void CpuEngine::forward_layer(int l, int B, int T) {
  ProfileRange range("forward layer", l);
  block_forward(P_.layers[l], plan_.layer(acts_.data(), l), block_context(B, T));
}

void CpuEngine::backward_layer(int l, int B, int T) {
  ProfileRange range("backward layer", l);
  float* a = acts_.data();
  block_backward(P_.layers[l], G_.layers[l], plan_.layer(a, l), plan_.scratch(a), a + plan_.dresid,
                 block_context(B, T));
}

void CpuEngine::forward_to_logits(const Batch& b) {
  // This rank's sizes (the whole model without tensor parallelism).
  const int B = b.B, T = b.T, N = B * T, C = d_.C, V = d_.V;
  const ActivationPlan& p = plan_;
  float* a = acts_.data();
  find_documents(b);
  vocab_parallel_embedding_forward(a + p.resid, b.inputs, P_.embed, N, C, d_.v_begin, V, region_);
  for (int l = 0; l < m_.num_hidden_layers; ++l) forward_layer(l, B, T);
  const float* last = a + p.resid + m_.num_hidden_layers * p.resid_stride;
  cpu::rmsnorm_forward(a + p.lnf, a + p.rstdf, last, P_.norm, N, C, m_.rms_norm_eps);
  column_parallel_forward(a + p.lnf, N, C, {{a + p.logits, P_.lm_head, V}});  // this rank's vocabulary columns
}

void CpuEngine::backward_from_dlogits(const Batch& b) {
  const int B = b.B, T = b.T, N = B * T, C = d_.C, V = d_.V;
  const ActivationPlan& p = plan_;
  float* a = acts_.data();
  float* dresid = a + p.dresid;
  float* dln = a + p.dln;
  // LM head and final norm (dlogits were written over the logits).
  column_parallel_backward(dln, a + p.lnf, N, C, {{a + p.logits, P_.lm_head, G_.lm_head, V}}, region_);
  zero(dresid, static_cast<size_t>(N) * C);
  const float* last = a + p.resid + m_.num_hidden_layers * p.resid_stride;
  cpu::rmsnorm_backward(dresid, G_.norm, dln, last, P_.norm, a + p.rstdf, N, C);
  for (int l = m_.num_hidden_layers - 1; l >= 0; --l) backward_layer(l, B, T);
  vocab_parallel_embedding_backward(G_.embed, dresid, b.inputs, N, C, d_.v_begin, V);
}

double CpuEngine::forward_backward(const Batch& b, double grad_scale) {
  validate_batch(b, m_, max_B_, max_T_);
  forward_to_logits(b);
  const size_t N = static_cast<size_t>(b.B) * b.T;
  float* a = acts_.data();
  cross_entropy(a + plan_.logits, nullptr, b, grad_scale);
  double sum = 0;
  for (size_t i = 0; i < N; ++i) sum += a[plan_.losses + i];
  backward_from_dlogits(b);
  return sum;
}

double CpuEngine::forward(const Batch& b, float* token_losses, int32_t* argmax, float* logits) {
  validate_batch(b, m_, max_B_, max_T_);
  forward_to_logits(b);
  const size_t N = static_cast<size_t>(b.B) * b.T;
  float* a = acts_.data();
  KVS_CHECK(!logits || tp_.size == 1, "forward: full logits are not gathered under tensor parallelism");
  if (logits) std::copy(a + plan_.logits, a + plan_.logits + N * m_.vocab_size, logits);
  if (!b.targets) return 0.0;
  cross_entropy(nullptr, argmax_.data(), b, 1.0);
  double sum = 0;
  for (size_t i = 0; i < N; ++i) sum += a[plan_.losses + i];
  if (token_losses) std::copy(a + plan_.losses, a + plan_.losses + N, token_losses);
  if (argmax) std::copy(argmax_.begin(), argmax_.begin() + N, argmax);
  return sum;
}

void CpuEngine::find_documents(const Batch& b) {
  if (m_.document_boundaries == DocumentBoundaries::None) return;
  for (int i = 0; i < b.B; ++i) {
    int start = 0;
    for (int t = 0; t < b.T; ++t) {
      const size_t at = static_cast<size_t>(i) * b.T + t;
      if (b.inputs[at] == m_.bos_token_id) start = t;
      doc_start_[at] = start;
    }
  }
}

const int32_t* CpuEngine::shift_doc_start() const {
  return m_.document_boundaries == DocumentBoundaries::None ? nullptr : doc_start_.data();
}

const int32_t* CpuEngine::attention_doc_start() const {
  return m_.document_boundaries == DocumentBoundaries::ShiftAndAttention ? doc_start_.data() : nullptr;
}

void CpuEngine::cross_entropy(float* dlogits, int32_t* argmax, const Batch& b, double grad_scale) {
  float* a = acts_.data();
  const int N = b.B * b.T;
  if (tp_.size == 1) {
    cpu::cross_entropy_forward_backward(a + plan_.losses, dlogits, argmax, a + plan_.logits, b.targets, b.mask, N,
                                        m_.vocab_size, grad_scale);
    return;
  }
  vocab_parallel_cross_entropy(a + plan_.losses, dlogits, argmax, a + plan_.logits, b.targets, b.mask, N, d_,
                               grad_scale, *tp_.comm, ce_scratch_);
}

double CpuEngine::grad_norm() { return std::sqrt(grad_sq_sum_range(0, grads_.size())); }

double CpuEngine::grad_sq_sum_range(size_t begin, size_t end) {
  // Fixed chunks summed in a fixed order: the same bits for any thread count.
  constexpr size_t kChunk = 1 << 16;
  KVS_CHECK(begin <= end && end <= grads_.size(), "grad_sq_sum_range: [{}, {}) outside {} floats", begin, end,
            grads_.size());
  const size_t n = end - begin, chunks = (n + kChunk - 1) / kChunk;
  std::vector<double>& partial = norm_partials_;
  partial.assign(chunks, 0.0);
  const float* g = grads_.data() + begin;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    double s = 0;
    const size_t e = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[c] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

void CpuEngine::adamw_step(const AdamWHyper& hp) { adamw_step_range(hp, 0, layout_.total); }

void CpuEngine::adamw_step_range(const AdamWHyper& hp, size_t begin, size_t end) {
  KVS_CHECK(opt_begin_ <= begin && begin <= end && end <= opt_end_,
            "adamw_step_range: [{}, {}) outside the optimizer moments held, [{}, {})", begin, end, opt_begin_, opt_end_);
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float lr = static_cast<float>(hp.lr), eps = static_cast<float>(hp.eps);
  const float scale = static_cast<float>(hp.grad_scale);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  for (const ParamTensor& t : layout_.tensors) {
    // The part of this tensor inside [begin, end): a shard boundary may cut a
    // tensor, and each element keeps its own tensor's decay and projection.
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    // Decoupled weight decay (as torch.optim.AdamW): p *= 1 - lr * wd, then the Adam update.
    const float decay = t.decay() ? 1.0f - lr * static_cast<float>(hp.weight_decay) : 1.0f;
    float* p = params_.data() + lo;
    const float* g = grads_.data() + lo;
    float* m = exp_avg_.data() + (lo - opt_begin_);
    float* v = exp_avg_sq_.data() + (lo - opt_begin_);
    const auto n = static_cast<ptrdiff_t>(hi - lo);
#pragma omp parallel for schedule(static)
    for (ptrdiff_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      p[i] = p[i] * decay - step_size * m[i] / denom;
    }
    // "clamp01": project the shift coefficients back onto [0, 1] after the
    // update. A clamp inside the forward would give the same values but a zero
    // gradient outside the box, so a coefficient that left it could never
    // come back; the projection keeps the forward in [0, 1] and keeps learning.
    if (t.kind == ParamKind::Shift && m_.kv_shift.parametrization == ShiftParametrization::Clamp01)
      for (ptrdiff_t i = 0; i < n; ++i) p[i] = std::clamp(p[i], 0.0f, 1.0f);
  }
}

}  // namespace kvs
