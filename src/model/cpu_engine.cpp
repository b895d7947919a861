// The Llama + KV shifting forward and backward on the CPU, op by op.
// Forward per layer (shapes for a micro-batch of N = B*T rows):
//   ln1 = RMSNorm(resid_l)                       [N, C]
//   q, k, v = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T       [N, Hq*D], [N, Hkv*D] x2
//   khat = RoPE(Shift(k; k_shift)), vhat = Shift(v; v_shift), q = RoPE(q)
//     (kv_shift.shift_q: q = RoPE(Shift(q_raw; q_shift)), appendix J)
//     (parametrization "sigmoid_gate": the coefficients are [1 - sigmoid(g), sigmoid(g)]
//      computed per layer into the plan's coef slice, the stored column 0 unused)
//     (position_encoding "none": no RoPE, khat = Shift(k), q = q)
//   attout = CausalAttention(q, khat, vhat)      [N, Hq*D]   (att saved)
//   res_mid = resid_l + attout Wo^T
//   h = SwiGLU(ln2 Wgate^T, ln2 Wup^T) with ln2 = RMSNorm(res_mid)
//   resid_{l+1} = res_mid + h Wdown^T
// then logits = RMSNorm(resid_L) Wlm^T and the masked cross-entropy.
// The backward walks the same list in reverse; every op accumulates into its
// gradients (kernels/cpu/ops.h), so buffers are zeroed right before use.
#include "model/cpu_engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "dist/comm.h"
#include "kernels/cpu/ops.h"
#include "model/vocab_parallel_loss.h"

namespace kvs {

namespace {
void zero(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

float sigmoidf(float g) { return 1.0f / (1.0f + std::exp(-g)); }

// The coefficients the shift op uses: the stored tensor itself, or for
// "sigmoid_gate" [1 - sigmoid(g), sigmoid(g)] per head (g = stored column 1)
// written into eff. Returns what the op should read.
const float* effective_coef(const float* stored, float* eff, int H, bool gate) {
  if (!gate) return stored;
  for (int h = 0; h < H; ++h) {
    const float s = sigmoidf(stored[h * 2 + 1]);
    eff[h * 2 + 0] = 1.0f - s;
    eff[h * 2 + 1] = s;
  }
  return eff;
}

// Chains d(effective coefficients) into the stored gate tensor's gradient:
// d g += sigmoid'(g) * (d cur - d prev); column 0 gets nothing.
void gate_backward(float* dstored, const float* deff, const float* stored, int H) {
  for (int h = 0; h < H; ++h) {
    const float s = sigmoidf(stored[h * 2 + 1]);
    dstored[h * 2 + 1] += s * (1.0f - s) * (deff[h * 2 + 1] - deff[h * 2 + 0]);
  }
}
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
  return p;
}

CpuEngine::CpuEngine(const ModelConfig& m, int max_batch, int max_seq_len, TensorParallel tp)
    : m_(m),
      tp_(tp),
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
  cpu::rope_tables(acts_.data() + plan_.rope_cos, acts_.data() + plan_.rope_sin, max_T_, m_.head_dim(), m_.rope_theta);
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

void CpuEngine::forward_to_logits(const Batch& b) {
  // This rank's sizes (the whole model without tensor parallelism).
  const int B = b.B, T = b.T, N = B * T, C = d_.C, F = d_.F, V = d_.V;
  const int Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D;
  const int QD = d_.QD(), KD = d_.KD(), W = m_.kv_shift.window;
  const ActivationPlan& p = plan_;
  float* a = acts_.data();
  const float* cos = a + p.rope_cos;
  const float* sin = a + p.rope_sin;
  const bool rope = m_.position_encoding == PositionEncoding::Rope;  // else q and k-hat enter attention unrotated
  const bool gated = m_.kv_shift.sigmoid_gate();
  const size_t W1 = static_cast<size_t>(W) + 1;
  find_documents(b);
  const int32_t* shift_doc = shift_doc_start();
  const int32_t* attention_doc = attention_doc_start();

  cpu::embedding_forward(a + p.resid, b.inputs, P_.embed, N, C, d_.v_begin, V);
  tp_sum(a + p.resid, static_cast<size_t>(N) * C);  // each token's row lives on one rank
  for (int l = 0; l < m_.num_hidden_layers; ++l) {
    const LayerView& w = P_.layers[l];
    float* resid = a + p.resid + l * p.resid_stride;
    float* res_mid = a + p.res_mid + l * p.res_mid_stride;
    float* ln1 = a + p.ln1 + l * p.ln_stride;
    float* rstd1 = a + p.rstd1 + l * p.rstd_stride;
    float* q = a + p.q + l * p.q_stride;
    float* k = a + p.k + l * p.kv_stride;
    float* v = a + p.v + l * p.kv_stride;
    float* khat = a + p.khat + l * p.kv_stride;
    float* vhat = w.v_shift ? a + p.vhat + l * p.kv_stride : v;  // no V shift: attention reads v itself
    float* att = a + p.att + l * p.att_stride;
    float* attout = a + p.attout + l * p.q_stride;
    float* ln2 = a + p.ln2 + l * p.ln_stride;
    float* rstd2 = a + p.rstd2 + l * p.rstd_stride;
    float* gate = a + p.gate + l * p.ffn_stride;
    float* up = a + p.up + l * p.ffn_stride;
    float* h = a + p.h + l * p.ffn_stride;
    float* coef = a + p.coef + l * p.coef_stride;
    const float* qc = w.q_shift ? effective_coef(w.q_shift, coef, Hq, gated) : nullptr;
    const float* kc = w.k_shift ? effective_coef(w.k_shift, coef + Hq * W1, Hkv, gated) : nullptr;
    const float* vc = w.v_shift ? effective_coef(w.v_shift, coef + (Hq + Hkv) * W1, Hkv, gated) : nullptr;

    cpu::rmsnorm_forward(ln1, rstd1, resid, w.ln1, N, C, m_.rms_norm_eps);
    if (w.q_shift) {
      float* qraw = a + p.qraw + l * p.qraw_stride;
      cpu::matmul_forward(qraw, ln1, w.wq, N, C, QD);
      cpu::kv_shift_forward(q, qraw, qc, B, T, Hq, D, W, shift_doc);
    } else {
      cpu::matmul_forward(q, ln1, w.wq, N, C, QD);
    }
    cpu::matmul_forward(k, ln1, w.wk, N, C, KD);
    cpu::matmul_forward(v, ln1, w.wv, N, C, KD);
    // KV shifting acts on the raw projections, before RoPE.
    if (w.k_shift) {
      cpu::kv_shift_forward(khat, k, kc, B, T, Hkv, D, W, shift_doc);
      if (rope) cpu::rope_forward(khat, khat, cos, sin, B, T, Hkv, D);
    } else if (rope) {
      cpu::rope_forward(khat, k, cos, sin, B, T, Hkv, D);
    } else {
      std::copy(k, k + static_cast<size_t>(N) * KD, khat);
    }
    if (w.v_shift) cpu::kv_shift_forward(vhat, v, vc, B, T, Hkv, D, W, shift_doc);
    if (rope) cpu::rope_forward(q, q, cos, sin, B, T, Hq, D);
    cpu::attention_forward(attout, att, q, khat, vhat, B, T, Hq, Hkv, D, attention_doc);
    cpu::matmul_forward(res_mid, attout, w.wo, N, QD, C);
    tp_sum(res_mid, static_cast<size_t>(N) * C);  // row-parallel o_proj: partial sums over this rank's heads
    cpu::residual_forward(res_mid, res_mid, resid, static_cast<size_t>(N) * C);

    cpu::rmsnorm_forward(ln2, rstd2, res_mid, w.ln2, N, C, m_.rms_norm_eps);
    cpu::matmul_forward(gate, ln2, w.w_gate, N, C, F);
    cpu::matmul_forward(up, ln2, w.w_up, N, C, F);
    cpu::swiglu_forward(h, gate, up, static_cast<size_t>(N) * F);
    float* next = a + p.resid + (l + 1) * p.resid_stride;
    cpu::matmul_forward(next, h, w.w_down, N, F, C);
    tp_sum(next, static_cast<size_t>(N) * C);  // row-parallel down_proj
    cpu::residual_forward(next, next, res_mid, static_cast<size_t>(N) * C);
  }
  const float* last = a + p.resid + m_.num_hidden_layers * p.resid_stride;
  cpu::rmsnorm_forward(a + p.lnf, a + p.rstdf, last, P_.norm, N, C, m_.rms_norm_eps);
  cpu::matmul_forward(a + p.logits, a + p.lnf, P_.lm_head, N, C, V);
}

void CpuEngine::backward_from_dlogits(const Batch& b) {
  // This rank's sizes (the whole model without tensor parallelism).
  const int B = b.B, T = b.T, N = B * T, C = d_.C, F = d_.F, V = d_.V;
  const int Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D;
  const int QD = d_.QD(), KD = d_.KD(), W = m_.kv_shift.window;
  const size_t NC = static_cast<size_t>(N) * C, NF = static_cast<size_t>(N) * F;
  const size_t NQ = static_cast<size_t>(N) * QD, NK = static_cast<size_t>(N) * KD;
  const ActivationPlan& p = plan_;
  float* a = acts_.data();
  const float* cos = a + p.rope_cos;
  const float* sin = a + p.rope_sin;
  float* dresid = a + p.dresid;
  float* dln = a + p.dln;
  const bool rope = m_.position_encoding == PositionEncoding::Rope;
  const bool gated = m_.kv_shift.sigmoid_gate();
  const size_t W1 = static_cast<size_t>(W) + 1;
  float* dcoef = a + p.dcoef;
  const int32_t* shift_doc = shift_doc_start();  // found by the forward of this batch

  // LM head and final norm (dlogits were written over the logits).
  zero(dln, NC);
  cpu::matmul_backward(dln, G_.lm_head, a + p.logits, a + p.lnf, P_.lm_head, N, C, V);
  tp_sum(dln, NC);  // each rank's vocabulary slice contributes to d lnf
  zero(dresid, NC);
  const float* last = a + p.resid + m_.num_hidden_layers * p.resid_stride;
  cpu::rmsnorm_backward(dresid, G_.norm, dln, last, P_.norm, a + p.rstdf, N, C);

  for (int l = m_.num_hidden_layers - 1; l >= 0; --l) {
    const LayerView& w = P_.layers[l];
    const LayerView& g = G_.layers[l];
    const float* resid = a + p.resid + l * p.resid_stride;
    const float* res_mid = a + p.res_mid + l * p.res_mid_stride;
    const float* ln1 = a + p.ln1 + l * p.ln_stride;
    const float* rstd1 = a + p.rstd1 + l * p.rstd_stride;
    const float* q = a + p.q + l * p.q_stride;
    const float* k = a + p.k + l * p.kv_stride;
    const float* v = a + p.v + l * p.kv_stride;
    const float* khat = a + p.khat + l * p.kv_stride;
    const float* vhat = w.v_shift ? a + p.vhat + l * p.kv_stride : v;
    const float* att = a + p.att + l * p.att_stride;
    const float* attout = a + p.attout + l * p.q_stride;
    const float* ln2 = a + p.ln2 + l * p.ln_stride;
    const float* rstd2 = a + p.rstd2 + l * p.rstd_stride;
    const float* gate = a + p.gate + l * p.ffn_stride;
    const float* up = a + p.up + l * p.ffn_stride;
    const float* h = a + p.h + l * p.ffn_stride;
    const float* coef = a + p.coef + l * p.coef_stride;
    const float* qc = gated ? coef : w.q_shift;
    const float* kc = gated ? coef + Hq * W1 : w.k_shift;
    const float* vc = gated ? coef + (Hq + Hkv) * W1 : w.v_shift;
    // d coefficients: straight into the gradient tensor ("free", "clamp01"), or
    // into scratch and then through the gate ("sigmoid_gate").
    auto shift_backward = [&](float* din, float* dstored, const float* dout, const float* in, const float* stored,
                              const float* c, int H) {
      if (!gated) {
        cpu::kv_shift_backward(din, dstored, dout, in, c, B, T, H, D, W, shift_doc);
        return;
      }
      zero(dcoef, static_cast<size_t>(H) * W1);
      cpu::kv_shift_backward(din, dcoef, dout, in, c, B, T, H, D, W, shift_doc);
      gate_backward(dstored, dcoef, stored, H);
    };

    // MLP: resid_{l+1} = res_mid + down(swiglu(gate(ln2), up(ln2))). dresid holds d resid_{l+1}.
    float* dh = a + p.dh;
    float* dgate = a + p.dgate;
    float* dup = a + p.dup;
    zero(dh, NF);
    cpu::matmul_backward(dh, g.w_down, dresid, h, w.w_down, N, F, C);
    zero(dgate, NF);
    zero(dup, NF);
    cpu::swiglu_backward(dgate, dup, dh, gate, up, NF);
    zero(dln, NC);
    cpu::matmul_backward(dln, g.w_gate, dgate, ln2, w.w_gate, N, C, F);
    cpu::matmul_backward(dln, g.w_up, dup, ln2, w.w_up, N, C, F);
    tp_sum(dln, NC);  // column-parallel gate/up: d ln2 summed over the ranks' columns
    cpu::rmsnorm_backward(dresid, g.ln2, dln, res_mid, w.ln2, rstd2, N, C);  // dresid is now d res_mid

    // Attention: res_mid = resid_l + o_proj(attout).
    float* dattout = a + p.dattout;
    float* dq = a + p.dq;
    float* dq_pre = a + p.dq_pre;
    float* dkhat = a + p.dkhat;
    float* dvhat = a + p.dvhat;
    float* dk = a + p.dk;
    float* dv = a + p.dv;
    zero(dattout, NQ);
    cpu::matmul_backward(dattout, g.wo, dresid, attout, w.wo, N, QD, C);
    zero(dq, NQ);
    zero(dkhat, NK);
    zero(dvhat, NK);
    cpu::attention_backward(dq, dkhat, dvhat, a + p.datt, dattout, q, khat, vhat, att, B, T, Hq, Hkv, D);
    // Without RoPE the gradients w.r.t. q and k-hat pass through unchanged.
    const float* dq_raw = dq;
    if (rope) {
      zero(dq_pre, NQ);
      cpu::rope_backward(dq_pre, dq, cos, sin, B, T, Hq, D);
      dq_raw = dq_pre;
    }
    if (w.q_shift) {  // dq_raw is d(shifted q); through the shift to d(raw q)
      float* dqs = a + p.dqs;
      zero(dqs, NQ);
      shift_backward(dqs, g.q_shift, dq_raw, a + p.qraw + l * p.qraw_stride, w.q_shift, qc, Hq);
      dq_raw = dqs;
    }
    zero(dk, NK);
    if (w.k_shift) {
      const float* dks = dkhat;
      if (rope) {
        zero(a + p.dks, NK);
        cpu::rope_backward(a + p.dks, dkhat, cos, sin, B, T, Hkv, D);
        dks = a + p.dks;
      }
      shift_backward(dk, g.k_shift, dks, k, w.k_shift, kc, Hkv);
    } else if (rope) {
      cpu::rope_backward(dk, dkhat, cos, sin, B, T, Hkv, D);
    } else {
      std::copy(dkhat, dkhat + NK, dk);
    }
    const float* dv_raw = dvhat;
    if (w.v_shift) {
      zero(dv, NK);
      shift_backward(dv, g.v_shift, dvhat, v, w.v_shift, vc, Hkv);
      dv_raw = dv;
    }
    zero(dln, NC);
    cpu::matmul_backward(dln, g.wq, dq_raw, ln1, w.wq, N, C, QD);
    cpu::matmul_backward(dln, g.wk, dk, ln1, w.wk, N, C, KD);
    cpu::matmul_backward(dln, g.wv, dv_raw, ln1, w.wv, N, C, KD);
    tp_sum(dln, NC);  // column-parallel q/k/v: d ln1 summed over the ranks' heads
    cpu::rmsnorm_backward(dresid, g.ln1, dln, resid, w.ln1, rstd1, N, C);  // dresid is now d resid_l
  }
  cpu::embedding_backward(G_.embed, dresid, b.inputs, N, C, d_.v_begin, V);
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

void CpuEngine::tp_sum(float* buf, size_t n) {
  if (tp_.size > 1) tp_.comm->all_reduce(buf, n, dist::DType::F32, dist::ReduceOp::Sum);
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
