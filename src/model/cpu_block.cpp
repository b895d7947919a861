#include "model/cpu_block.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/op_profile.h"
#include "kernels/cpu/ops.h"
#include "parallel/linear.h"

namespace kvs {

namespace prof = cpu::profile;

namespace {

// Scratch gradients that ops add into start at zero.
void zero(float* p, size_t n) {
  const prof::Scope timed("zero scratch");
  cpu::zero_fill(p, n);
}

// The coefficients the shift op uses: the stored tensor itself, or for
// "sigmoid_gate" [1 - sigmoid(g), sigmoid(g)] per head (g = stored column 1)
// written into eff. Returns what the op should read.
const float* effective_coef(const float* stored, float* eff, int H, bool gate) {
  if (!gate) return stored;
  cpu::shift_gate_forward(eff, stored, H);
  return eff;
}

}  // namespace

namespace {

// The rows of one run of whole sequences that the positional ops see: B
// sequences of T rows from row0, at positions pos0.. (RoPE, the causal mask),
// the shift's history in the halos (null: zeros) and its document starts.
struct Segment {
  size_t row0;
  int B, T, pos0;
  const float *q_halo, *k_halo, *v_halo;
  const int32_t* shift_doc;
};

// One segment without context parallelism, two (this rank's chunks) with it.
// With context parallelism the halos are the ring group's: every rank calls
// this at the same point of the same layer.
int segments(Segment out[2], const LayerView& w, const LayerActs& a, const BlockContext& c) {
  if (!c.cp) {
    out[0] = {0, c.B, c.T, c.pos0, c.q_halo, c.k_halo, c.v_halo, c.shift_doc};
    return 1;
  }
  const CpLayout& l = *c.cp_layout;
  const size_t QD = c.d.QD(), KD = c.d.KD(), rows = static_cast<size_t>(l.B) * l.Tc, halo = static_cast<size_t>(l.B) * c.window;
  const float* qh = w.q_shift ? c.cp->halo(0, a.qraw, QD, l) : nullptr;
  const float* kh = w.k_shift ? c.cp->halo(1, a.k, KD, l) : nullptr;
  const float* vh = w.v_shift ? c.cp->halo(2, a.v, KD, l) : nullptr;
  for (int h = 0; h < 2; ++h)
    out[h] = {h * rows, l.B, l.Tc, l.pos0(h), qh ? qh + h * halo * QD : nullptr, kh ? kh + h * halo * KD : nullptr,
              vh ? vh + h * halo * KD : nullptr, c.shift_doc ? c.shift_doc + h * rows : nullptr};
  return 2;
}

// gate_proj and up_proj as one [2F, C] matrix: up must follow gate directly.
float* gate_up_weight(const LayerView& w, int F, int C) {
  KVS_CHECK(w.w_up == w.w_gate + static_cast<size_t>(F) * C, "block: up_proj must follow gate_proj in the parameters");
  return w.w_gate;
}

// The forward's two causal products (Q K^T, P V): 2 * T*T/2 * D multiply-adds
// each per head; the backward does twice as much.
double attention_flops(int B, int Hq, int T, int D) { return 2.0 * B * Hq * static_cast<double>(T) * T * D; }

}  // namespace

void block_forward(const LayerView& w, const LayerActs& a, const BlockContext& c) {
  const int B = c.B, T = c.T, N = B * T, C = c.d.C, F = c.d.F;
  const int Hq = c.d.Hq, Hkv = c.d.Hkv, D = c.d.D, QD = c.d.QD(), KD = c.d.KD(), W = c.window;
  const size_t W1 = static_cast<size_t>(W) + 1;
  KVS_CHECK(c.kv_past == 0 || B == 1, "block_forward: cached keys need one sequence, got {}", B);
  const size_t NCl = c.tp.local_rows(N) * C;  // the residual stream's rows on this rank
  const float* qc = w.q_shift ? effective_coef(w.q_shift, a.coef, Hq, c.sigmoid_gate) : nullptr;
  const float* kc = w.k_shift ? effective_coef(w.k_shift, a.coef + Hq * W1, Hkv, c.sigmoid_gate) : nullptr;
  const float* vc = w.v_shift ? effective_coef(w.v_shift, a.coef + (Hq + Hkv) * W1, Hkv, c.sigmoid_gate) : nullptr;

  {
    const prof::Scope timed("rmsnorm fwd");
    cpu::rmsnorm_forward(a.ln1, a.rstd1, a.resid, w.ln1, static_cast<int>(NCl / C), C, c.eps);
  }
  {
    const prof::Label label("qkv proj");
    column_parallel_forward(a.ln1, N, C, {{w.q_shift ? a.qraw : a.q, w.wq, QD}, {a.k, w.wk, KD}, {a.v, w.wv, KD}},
                            c.tp, c.sp_full);
  }
  // KV shifting acts on the raw projections, before RoPE.
  Segment seg[2];
  const int nseg = segments(seg, w, a, c);
  for (int i = 0; i < nseg; ++i) {
    const prof::Scope timed("shift+rope fwd");
    const Segment& g = seg[i];
    const size_t rq = g.row0 * QD, rk = g.row0 * KD, n = static_cast<size_t>(g.B) * g.T * KD;
    const size_t at = static_cast<size_t>(g.pos0) * (D / 2);  // RoPE rows from the segment's first position
    const float* cos = c.rope ? c.rope_cos + at : nullptr;
    const float* sin = c.rope ? c.rope_sin + at : nullptr;
    if (w.q_shift) cpu::kv_shift_forward(a.q + rq, a.qraw + rq, qc, g.B, g.T, Hq, D, W, g.shift_doc, g.q_halo);
    if (w.k_shift) {
      cpu::kv_shift_forward(a.khat + rk, a.k + rk, kc, g.B, g.T, Hkv, D, W, g.shift_doc, g.k_halo);
      if (c.rope) cpu::rope_forward(a.khat + rk, a.khat + rk, cos, sin, g.B, g.T, Hkv, D);
    } else if (c.rope) {
      cpu::rope_forward(a.khat + rk, a.k + rk, cos, sin, g.B, g.T, Hkv, D);
    } else {
      std::copy(a.k + rk, a.k + rk + n, a.khat + rk);
    }
    if (w.v_shift) cpu::kv_shift_forward(a.vhat + rk, a.v + rk, vc, g.B, g.T, Hkv, D, W, g.shift_doc, g.v_halo);
    if (c.rope) cpu::rope_forward(a.q + rq, a.q + rq, cos, sin, g.B, g.T, Hq, D);
  }
  if (c.cp) {
    const prof::Scope timed("attention fwd", attention_flops(B, Hq, T, D));
    c.cp->forward(a.attout, a.att, a.q, a.khat, a.vhat, c.attention_doc, *c.cp_layout);
  } else {
    const prof::Scope timed("attention fwd", attention_flops(B, Hq, T, D));
    const size_t past = static_cast<size_t>(c.kv_past) * KD;
    cpu::attention_forward(a.attout, a.att, nullptr, a.q, a.khat - past, a.vhat - past, B, T, c.kv_past + T, Hq, Hkv,
                           D, c.pos0, c.pos0 - c.kv_past, c.attention_doc);
  }
  {
    const prof::Label label("o proj");
    row_parallel_forward(a.res_mid, a.attout, w.wo, N, QD, C, c.tp, c.sp_full);
  }
  {
    const prof::Scope timed("residual+rmsnorm fwd");
    cpu::residual_rmsnorm_forward(a.res_mid, a.ln2, a.rstd2, a.res_mid, a.resid, w.ln2, static_cast<int>(NCl / C), C,
                                  c.eps);
  }
  {
    const prof::Label label("gate,up proj");
    column_parallel_forward(a.ln2, N, C, {{a.gate_up, gate_up_weight(w, F, C), 2 * F}}, c.tp, c.sp_full);
  }
  {
    const prof::Scope timed("swiglu fwd");
    cpu::swiglu_forward(a.h, a.gate_up, N, F);
  }
  {
    const prof::Label label("down proj");
    row_parallel_forward(a.out, a.h, w.w_down, N, F, C, c.tp, c.sp_full);
  }
  const prof::Scope timed("residual add");
  cpu::residual_forward(a.out, a.out, a.res_mid, NCl);
}

void block_backward(const LayerView& w, const LayerView& g, const LayerActs& a, const LayerScratch& s, float* dresid,
                    const BlockContext& c) {
  const int B = c.B, T = c.T, N = B * T, C = c.d.C, F = c.d.F;
  const int Hq = c.d.Hq, Hkv = c.d.Hkv, D = c.d.D, QD = c.d.QD(), KD = c.d.KD(), W = c.window;
  const size_t NQ = static_cast<size_t>(N) * QD, NK = static_cast<size_t>(N) * KD;
  const size_t W1 = static_cast<size_t>(W) + 1;
  const int Nl = static_cast<int>(c.tp.local_rows(N));  // the residual stream's rows on this rank
  KVS_CHECK(c.pos0 == 0 && c.kv_past == 0 && !c.q_halo && !c.k_halo && !c.v_halo,
            "block_backward: only whole sequences from position 0");
  const bool gated = c.sigmoid_gate;
  const float* qc = gated ? a.coef : w.q_shift;
  const float* kc = gated ? a.coef + Hq * W1 : w.k_shift;
  const float* vc = gated ? a.coef + (Hq + Hkv) * W1 : w.v_shift;

  // MLP: out = res_mid + down(swiglu(gate(ln2), up(ln2))). dresid holds d out.
  // dh, dgate_up and dattout are written whole by their first op (no zeroing pass).
  {
    const prof::Label label("down proj");
    row_parallel_backward(s.dh, g.w_down, dresid, a.h, w.w_down, N, F, C, c.tp, c.sp_full, /*overwrite_dx=*/true);
  }
  {
    const prof::Scope timed("swiglu bwd");
    cpu::swiglu_backward(s.dgate_up, s.dh, a.gate_up, N, F, /*overwrite=*/true);
  }
  {
    const prof::Label label("gate,up proj");
    column_parallel_backward(s.dln, a.ln2, N, C,
                             {{s.dgate_up, gate_up_weight(w, F, C), gate_up_weight(g, F, C), 2 * F}}, c.tp, c.sp_full,
                             c.sp_full2);
  }
  {
    const prof::Scope timed("rmsnorm bwd");
    cpu::rmsnorm_backward(dresid, g.ln2, s.dln, a.res_mid, w.ln2, a.rstd2, Nl, C);  // dresid is now d res_mid
  }

  // Attention: res_mid = resid + o_proj(attout).
  {
    const prof::Label label("o proj");
    row_parallel_backward(s.dattout, g.wo, dresid, a.attout, w.wo, N, QD, C, c.tp, c.sp_full, /*overwrite_dx=*/true);
  }
  if (c.cp) {  // the ring adds each key chunk's part
    zero(s.dq, NQ);
    zero(s.dkhat, NK);
    zero(s.dvhat, NK);
    const prof::Scope timed("attention bwd", 2 * attention_flops(B, Hq, T, D));
    c.cp->backward(s.dq, s.dkhat, s.dvhat, s.dattout, a.attout, a.q, a.khat, a.vhat, a.att, *c.cp_layout);
  } else {
    const prof::Scope timed("attention bwd", 2 * attention_flops(B, Hq, T, D));
    cpu::attention_backward(s.dq, s.dkhat, s.dvhat, s.dattout, a.q, a.khat, a.vhat, a.att, B, T, Hq, Hkv, D,
                            /*overwrite=*/true);
  }

  // Through RoPE and the shifts, segment by segment, to the raw projections.
  // Without RoPE the gradients w.r.t. q and k-hat pass through unchanged. The
  // coefficient gradients go straight into the gradient tensor ("free",
  // "clamp01"), or for "sigmoid_gate" into dcoef and then through the gate.
  // Each op below writes its rows of dqs, dq_pre, dks, dk and dv whole
  // (overwrite; the segments cover every row): no zeroing pass.
  const float* dq_raw = c.rope ? s.dq_pre : s.dq;
  const size_t coefs = (static_cast<size_t>(Hq) + 2 * Hkv) * W1;
  if (gated) zero(s.dcoef, coefs);
  float* dcq = gated ? s.dcoef : g.q_shift;
  float* dck = gated ? s.dcoef + Hq * W1 : g.k_shift;
  float* dcv = gated ? s.dcoef + (Hq + Hkv) * W1 : g.v_shift;
  // Context parallelism: the gradients of the halo rows, returned to their owners below.
  float* dhq = c.cp && w.q_shift ? c.cp->halo_grad(0, QD, *c.cp_layout) : nullptr;
  float* dhk = c.cp && w.k_shift ? c.cp->halo_grad(1, KD, *c.cp_layout) : nullptr;
  float* dhv = c.cp && w.v_shift ? c.cp->halo_grad(2, KD, *c.cp_layout) : nullptr;
  Segment seg[2];
  const int nseg = segments(seg, w, a, c);  // (with context parallelism: the halos again)
  for (int i = 0; i < nseg; ++i) {
    const prof::Scope timed("shift+rope bwd");
    const Segment& sg = seg[i];
    const size_t rq = sg.row0 * QD, rk = sg.row0 * KD, n = static_cast<size_t>(sg.B) * sg.T * KD;
    const size_t at = static_cast<size_t>(sg.pos0) * (D / 2);
    const float* cos = c.rope ? c.rope_cos + at : nullptr;
    const float* sin = c.rope ? c.rope_sin + at : nullptr;
    const size_t hq = static_cast<size_t>(i) * sg.B * W * QD, hk = static_cast<size_t>(i) * sg.B * W * KD;
    constexpr bool kOverwrite = true;
    if (c.rope) cpu::rope_backward(s.dq_pre + rq, s.dq + rq, cos, sin, sg.B, sg.T, Hq, D, kOverwrite);
    if (w.q_shift)  // dq_raw is d(shifted q); through the shift to d(raw q)
      cpu::kv_shift_backward(s.dqs + rq, dcq, dq_raw + rq, a.qraw + rq, qc, sg.B, sg.T, Hq, D, W, sg.shift_doc,
                             sg.q_halo, dhq ? dhq + hq : nullptr, kOverwrite);
    if (w.k_shift) {
      const float* dks = s.dkhat;
      if (c.rope) {
        cpu::rope_backward(s.dks + rk, s.dkhat + rk, cos, sin, sg.B, sg.T, Hkv, D, kOverwrite);
        dks = s.dks;
      }
      cpu::kv_shift_backward(s.dk + rk, dck, dks + rk, a.k + rk, kc, sg.B, sg.T, Hkv, D, W, sg.shift_doc, sg.k_halo,
                             dhk ? dhk + hk : nullptr, kOverwrite);
    } else if (c.rope) {
      cpu::rope_backward(s.dk + rk, s.dkhat + rk, cos, sin, sg.B, sg.T, Hkv, D, kOverwrite);
    } else {
      std::copy(s.dkhat + rk, s.dkhat + rk + n, s.dk + rk);
    }
    if (w.v_shift)
      cpu::kv_shift_backward(s.dv + rk, dcv, s.dvhat + rk, a.v + rk, vc, sg.B, sg.T, Hkv, D, W, sg.shift_doc,
                             sg.v_halo, dhv ? dhv + hk : nullptr, kOverwrite);
    if (const auto& st = c.shift_terms; st.sq) {  // tests only: the stored coefficients are the effective ones
      KVS_CHECK(!gated && !c.cp, "shift term squares: the \"free\" or \"clamp01\" shift, without context parallelism");
      if (w.q_shift) cpu::kv_shift_term_squares(st.at(g.q_shift), dq_raw + rq, a.qraw + rq, sg.B, sg.T, Hq, D, W, sg.shift_doc);
      if (w.k_shift)
        cpu::kv_shift_term_squares(st.at(g.k_shift), (c.rope ? s.dks : s.dkhat) + rk, a.k + rk, sg.B, sg.T, Hkv, D, W,
                                   sg.shift_doc);
      if (w.v_shift) cpu::kv_shift_term_squares(st.at(g.v_shift), s.dvhat + rk, a.v + rk, sg.B, sg.T, Hkv, D, W, sg.shift_doc);
    }
  }
  if (w.q_shift) dq_raw = s.dqs;
  if (dhq) c.cp->halo_backward(dhq, s.dqs, QD, *c.cp_layout);
  if (dhk) c.cp->halo_backward(dhk, s.dk, KD, *c.cp_layout);
  if (dhv) c.cp->halo_backward(dhv, s.dv, KD, *c.cp_layout);
  if (gated) {
    if (w.q_shift) cpu::shift_gate_backward(g.q_shift, s.dcoef, w.q_shift, Hq);
    if (w.k_shift) cpu::shift_gate_backward(g.k_shift, s.dcoef + Hq * W1, w.k_shift, Hkv);
    if (w.v_shift) cpu::shift_gate_backward(g.v_shift, s.dcoef + (Hq + Hkv) * W1, w.v_shift, Hkv);
  }
  const float* dv_raw = w.v_shift ? s.dv : s.dvhat;
  {
    const prof::Label label("qkv proj");
    column_parallel_backward(s.dln, a.ln1, N, C,
                             {{dq_raw, w.wq, g.wq, QD}, {s.dk, w.wk, g.wk, KD}, {dv_raw, w.wv, g.wv, KD}}, c.tp,
                             c.sp_full, c.sp_full2);
  }
  const prof::Scope timed("rmsnorm bwd");
  cpu::rmsnorm_backward(dresid, g.ln1, s.dln, a.resid, w.ln1, a.rstd1, Nl, C);  // dresid is now d resid
}

}  // namespace kvs
