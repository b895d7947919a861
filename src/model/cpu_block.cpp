#include "model/cpu_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "parallel/linear.h"

namespace kvs {

namespace {

void zero(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

// The coefficients the shift op uses: the stored tensor itself, or for
// "sigmoid_gate" [1 - sigmoid(g), sigmoid(g)] per head (g = stored column 1)
// written into eff. Returns what the op should read.
const float* effective_coef(const float* stored, float* eff, int H, bool gate) {
  if (!gate) return stored;
  cpu::shift_gate_forward(eff, stored, H);
  return eff;
}

}  // namespace

void block_forward(const LayerView& w, const LayerActs& a, const BlockContext& c) {
  const int B = c.B, T = c.T, N = B * T, C = c.d.C, F = c.d.F;
  const int Hq = c.d.Hq, Hkv = c.d.Hkv, D = c.d.D, QD = c.d.QD(), KD = c.d.KD(), W = c.window;
  const size_t NC = static_cast<size_t>(N) * C, W1 = static_cast<size_t>(W) + 1;
  KVS_CHECK(c.kv_past == 0 || B == 1, "block_forward: cached keys need one sequence, got {}", B);
  const size_t at = static_cast<size_t>(c.pos0) * (D / 2);  // RoPE rows from the first position
  const float* cos = c.rope ? c.rope_cos + at : nullptr;
  const float* sin = c.rope ? c.rope_sin + at : nullptr;
  const float* qc = w.q_shift ? effective_coef(w.q_shift, a.coef, Hq, c.sigmoid_gate) : nullptr;
  const float* kc = w.k_shift ? effective_coef(w.k_shift, a.coef + Hq * W1, Hkv, c.sigmoid_gate) : nullptr;
  const float* vc = w.v_shift ? effective_coef(w.v_shift, a.coef + (Hq + Hkv) * W1, Hkv, c.sigmoid_gate) : nullptr;

  cpu::rmsnorm_forward(a.ln1, a.rstd1, a.resid, w.ln1, N, C, c.eps);
  column_parallel_forward(a.ln1, N, C, {{w.q_shift ? a.qraw : a.q, w.wq, QD}, {a.k, w.wk, KD}, {a.v, w.wv, KD}});
  if (w.q_shift) cpu::kv_shift_forward(a.q, a.qraw, qc, B, T, Hq, D, W, c.shift_doc, c.q_halo);
  // KV shifting acts on the raw projections, before RoPE.
  if (w.k_shift) {
    cpu::kv_shift_forward(a.khat, a.k, kc, B, T, Hkv, D, W, c.shift_doc, c.k_halo);
    if (c.rope) cpu::rope_forward(a.khat, a.khat, cos, sin, B, T, Hkv, D);
  } else if (c.rope) {
    cpu::rope_forward(a.khat, a.k, cos, sin, B, T, Hkv, D);
  } else {
    std::copy(a.k, a.k + static_cast<size_t>(N) * KD, a.khat);
  }
  if (w.v_shift) cpu::kv_shift_forward(a.vhat, a.v, vc, B, T, Hkv, D, W, c.shift_doc, c.v_halo);
  if (c.rope) cpu::rope_forward(a.q, a.q, cos, sin, B, T, Hq, D);
  const size_t past = static_cast<size_t>(c.kv_past) * KD;
  cpu::attention_forward(a.attout, a.att, nullptr, a.q, a.khat - past, a.vhat - past, B, T, c.kv_past + T, Hq, Hkv, D,
                         c.pos0, c.pos0 - c.kv_past, c.attention_doc);
  row_parallel_forward(a.res_mid, a.attout, w.wo, N, QD, C, c.tp);
  cpu::residual_forward(a.res_mid, a.res_mid, a.resid, NC);

  cpu::rmsnorm_forward(a.ln2, a.rstd2, a.res_mid, w.ln2, N, C, c.eps);
  column_parallel_forward(a.ln2, N, C, {{a.gate, w.w_gate, F}, {a.up, w.w_up, F}});
  cpu::swiglu_forward(a.h, a.gate, a.up, static_cast<size_t>(N) * F);
  row_parallel_forward(a.out, a.h, w.w_down, N, F, C, c.tp);
  cpu::residual_forward(a.out, a.out, a.res_mid, NC);
}

void block_backward(const LayerView& w, const LayerView& g, const LayerActs& a, const LayerScratch& s, float* dresid,
                    const BlockContext& c) {
  const int B = c.B, T = c.T, N = B * T, C = c.d.C, F = c.d.F;
  const int Hq = c.d.Hq, Hkv = c.d.Hkv, D = c.d.D, QD = c.d.QD(), KD = c.d.KD(), W = c.window;
  const size_t NF = static_cast<size_t>(N) * F, NQ = static_cast<size_t>(N) * QD, NK = static_cast<size_t>(N) * KD;
  const size_t W1 = static_cast<size_t>(W) + 1;
  KVS_CHECK(c.pos0 == 0 && c.kv_past == 0 && !c.q_halo && !c.k_halo && !c.v_halo,
            "block_backward: only whole sequences from position 0");
  const float* cos = c.rope_cos;
  const float* sin = c.rope_sin;
  const bool gated = c.sigmoid_gate;
  const float* qc = gated ? a.coef : w.q_shift;
  const float* kc = gated ? a.coef + Hq * W1 : w.k_shift;
  const float* vc = gated ? a.coef + (Hq + Hkv) * W1 : w.v_shift;
  // d coefficients: straight into the gradient tensor ("free", "clamp01"), or
  // into scratch and then through the gate ("sigmoid_gate").
  auto shift_backward = [&](float* din, float* dstored, const float* dout, const float* in, const float* stored,
                            const float* coef, int H) {
    if (!gated) {
      cpu::kv_shift_backward(din, dstored, dout, in, coef, B, T, H, D, W, c.shift_doc);
      return;
    }
    zero(s.dcoef, static_cast<size_t>(H) * W1);
    cpu::kv_shift_backward(din, s.dcoef, dout, in, coef, B, T, H, D, W, c.shift_doc);
    cpu::shift_gate_backward(dstored, s.dcoef, stored, H);
  };

  // MLP: out = res_mid + down(swiglu(gate(ln2), up(ln2))). dresid holds d out.
  zero(s.dh, NF);
  row_parallel_backward(s.dh, g.w_down, dresid, a.h, w.w_down, N, F, C);
  zero(s.dgate, NF);
  zero(s.dup, NF);
  cpu::swiglu_backward(s.dgate, s.dup, s.dh, a.gate, a.up, NF);
  column_parallel_backward(s.dln, a.ln2, N, C, {{s.dgate, w.w_gate, g.w_gate, F}, {s.dup, w.w_up, g.w_up, F}}, c.tp);
  cpu::rmsnorm_backward(dresid, g.ln2, s.dln, a.res_mid, w.ln2, a.rstd2, N, C);  // dresid is now d res_mid

  // Attention: res_mid = resid + o_proj(attout).
  zero(s.dattout, NQ);
  row_parallel_backward(s.dattout, g.wo, dresid, a.attout, w.wo, N, QD, C);
  zero(s.dq, NQ);
  zero(s.dkhat, NK);
  zero(s.dvhat, NK);
  cpu::attention_backward(s.dq, s.dkhat, s.dvhat, s.datt, s.dattout, a.q, a.khat, a.vhat, a.att, B, T, Hq, Hkv, D);
  // Without RoPE the gradients w.r.t. q and k-hat pass through unchanged.
  const float* dq_raw = s.dq;
  if (c.rope) {
    zero(s.dq_pre, NQ);
    cpu::rope_backward(s.dq_pre, s.dq, cos, sin, B, T, Hq, D);
    dq_raw = s.dq_pre;
  }
  if (w.q_shift) {  // dq_raw is d(shifted q); through the shift to d(raw q)
    zero(s.dqs, NQ);
    shift_backward(s.dqs, g.q_shift, dq_raw, a.qraw, w.q_shift, qc, Hq);
    dq_raw = s.dqs;
  }
  zero(s.dk, NK);
  if (w.k_shift) {
    const float* dks = s.dkhat;
    if (c.rope) {
      zero(s.dks, NK);
      cpu::rope_backward(s.dks, s.dkhat, cos, sin, B, T, Hkv, D);
      dks = s.dks;
    }
    shift_backward(s.dk, g.k_shift, dks, a.k, w.k_shift, kc, Hkv);
  } else if (c.rope) {
    cpu::rope_backward(s.dk, s.dkhat, cos, sin, B, T, Hkv, D);
  } else {
    std::copy(s.dkhat, s.dkhat + NK, s.dk);
  }
  const float* dv_raw = s.dvhat;
  if (w.v_shift) {
    zero(s.dv, NK);
    shift_backward(s.dv, g.v_shift, s.dvhat, a.v, w.v_shift, vc, Hkv);
    dv_raw = s.dv;
  }
  column_parallel_backward(s.dln, a.ln1, N, C,
                           {{dq_raw, w.wq, g.wq, QD}, {s.dk, w.wk, g.wk, KD}, {dv_raw, w.wv, g.wv, KD}}, c.tp);
  cpu::rmsnorm_backward(dresid, g.ln1, s.dln, a.resid, w.ln1, a.rstd1, N, C);  // dresid is now d resid
}

}  // namespace kvs
