// One decoder layer of the CPU reference engine, forward and backward, on
// buffers the caller owns: the engine's activation plan during training, the
// generator's KV cache when decoding. Per layer, for a micro-batch of
// N = B*T rows (this tensor-parallel rank's heads and FFN columns):
//   ln1 = RMSNorm(resid)                                  [N, C]
//   q, k, v = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T                column-parallel
//   khat = RoPE(Shift(k; k_shift)), vhat = Shift(v; v_shift), q = RoPE(q)
//     (kv_shift.shift_q: q = RoPE(Shift(q_raw; q_shift)), appendix J)
//     (parametrization "sigmoid_gate": the coefficients [1 - sigmoid(g), sigmoid(g)]
//      are computed into the layer's coef slice; the stored column 0 is unused)
//     (position_encoding "none": no RoPE, khat = Shift(k), q = q)
//   attout = CausalAttention(q, khat, vhat)               (att saved)
//   res_mid = resid + attout Wo^T                         row-parallel
//   gate_up = ln2 [Wgate; Wup]^T, ln2 = RMSNorm(res_mid)   column-parallel, one GEMM
//   h = SwiGLU(gate_up)
//   out = res_mid + h Wdown^T                             row-parallel
// The backward walks the same list in reverse; every op accumulates into its
// gradients (kernels/cpu/ops.h), so a scratch buffer is zeroed right before
// use unless its first writer overwrites it (the ops' overwrite flags).
#pragma once
#include <cstdint>

#include "model/params.h"
#include "parallel/context_parallel.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_region.h"

namespace kvs {

// One layer's activations. Each points at N = B*T rows of its width, but
// under sequence parallelism the residual stream and the norms (resid,
// res_mid, out, ln1, rstd1, ln2, rstd2) hold only this rank's N/tp rows.
struct LayerActs {
  const float* resid;  // the layer's input [N, C]
  float* res_mid;      // resid + attention [N, C]
  float* out;          // the layer's output, the next layer's resid [N, C] (the forward lets it alias resid)
  float *ln1, *rstd1, *ln2, *rstd2;
  float* qraw;         // the raw q projection under shift_q; null otherwise
  float* q;            // shifted (shift_q) and rotated q [N, Hq*D]
  float *k, *v;        // raw projections [N, Hkv*D]
  float *khat, *vhat;  // what attention reads; vhat == v without a V shift
  float* att;          // softmax probabilities [B, Hq, T, kv_past + T]
  float* attout;       // [N, Hq*D]
  float* gate_up;      // [N, 2F]: gate columns, then up columns
  float* h;            // [N, F]
  float* coef;         // effective shift coefficients, [Hq | Hkv | Hkv] x (W+1)
};

// Backward scratch, shared by every layer (dln: N/tp rows under sequence parallelism).
struct LayerScratch {
  float *dln, *dh, *dgate_up, *dattout, *dq, *dq_pre, *dkhat, *dks, *dk, *dvhat, *dv, *dqs, *dcoef;
};

// What every layer of one micro-batch (or one decoding block) shares.
struct BlockContext {
  int B = 0, T = 0;
  LocalDims d;
  int window = 1;
  bool rope = true;
  bool sigmoid_gate = false;
  double eps = 1e-5;
  const float *rope_cos = nullptr, *rope_sin = nullptr;  // [positions, D/2] from position 0
  // Where the rows sit: row t of every sequence is at position pos0 + t
  // (RoPE, the causal mask). Training: 0.
  int pos0 = 0;
  // Decoding (B = 1): attention also reads the kv_past rows of K̂ and V̂ stored
  // right before a.khat and a.vhat (positions pos0 - kv_past .. pos0 - 1).
  int kv_past = 0;
  // The raw projections of the W positions before row 0 ([B, W, H*D] each;
  // null: zeros, as before position 0): the shift's history when decoding.
  const float *q_halo = nullptr, *k_halo = nullptr, *v_halo = nullptr;
  const int32_t* shift_doc = nullptr;      // [B, T] document starts in row coordinates (null: none)
  const int32_t* attention_doc = nullptr;  // [B, T] document starts in positions (null: none)
  TensorParallelRegion tp;
  // Sequence parallelism: two [N, C] buffers for rows gathered or not yet scattered.
  float *sp_full = nullptr, *sp_full2 = nullptr;
  // Context parallelism (parallel/context_parallel.h): the rows are this
  // rank's two chunks of every sequence, [2][B][T/2] (T = 2 Tc here), with
  // shift_doc per half in that half's row coordinates; the shift takes its
  // halo from the ring group and attention is the ring's.
  ContextParallelAttention* cp = nullptr;
  const CpLayout* cp_layout = nullptr;
  // Test instrumentation (CpuEngine::collect_shift_term_squares): when sq is
  // set, the backward adds the squares of each shift coefficient gradient's
  // terms (cpu::kv_shift_term_squares) at sq + (that gradient - grads).
  struct ShiftTermSquares {
    const float* grads = nullptr;
    double* sq = nullptr;
    double* at(const float* grad) const { return sq + (grad - grads); }
  } shift_terms;
};

// The weights' gate_proj and up_proj (and their gradients') must be adjacent,
// up right after gate (ParamLayout's order): one [2F, C] matrix.
void block_forward(const LayerView& w, const LayerActs& a, const BlockContext& c);
// dresid holds d out on entry and d resid on return; gradients go into g.
// Training only: pos0 = kv_past = 0, no halos given (context parallelism makes its own).
void block_backward(const LayerView& w, const LayerView& g, const LayerActs& a, const LayerScratch& s, float* dresid,
                    const BlockContext& c);

}  // namespace kvs
