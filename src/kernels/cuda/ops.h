// CUDA kernels: the host-side launchers the CUDA engine calls.
//
// Mirrors kernels/cpu/ops.h op by op (the CPU op is each kernel's oracle in
// tests/kernels/cuda/, one test file per kernel). Conventions, where they differ from the CPU ones:
// - Storage is bf16 for activations and their gradients, fp32 for everything
//   that is reduced or updated: parameter gradients, RMSNorm rstd, log-sum-exp,
//   losses, master weights, AdamW moments. Every sum and every matmul
//   accumulates in fp32.
// - Activation gradients are OVERWRITTEN (din = ...), except where an argument
//   says "added": bf16 read-modify-write chains would round twice.
//   Parameter gradients (fp32) are ACCUMULATED (+=), as on the CPU, so
//   gradient accumulation over micro-batches is just "don't zero".
// - Deterministic: no floating-point atomics anywhere. Reductions across rows
//   go through per-block partials in a caller-provided fp32 `scratch` and a
//   second pass that sums them in a fixed order; the *_scratch_floats()
//   functions say how much each launcher needs.
// - Row strides: `ld_*` arguments are the distance in elements between rows of
//   a [rows, ...] matrix, so a kernel can read Q, K and V straight out of the
//   fused QKV projection [N, QD + 2 KD], or gate and up out of [N, 2F].
// - Every launcher is asynchronous on `stream` and checks its launch
//   (kvs::Error naming the kernel on failure).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvs::cuda {

using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------- conversion
void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t stream);
void fill_f32(float* out, float value, size_t n, cudaStream_t stream);
void fill_bf16(bf16* out, float value, size_t n, cudaStream_t stream);
// y[0..n) += x[0..n) (fp32; y and x must not partially overlap).
void add_f32(float* y, const float* x, size_t n, cudaStream_t stream);
// y[0..n) += x[0..n) widened from bf16 (fp32 accumulators of bf16 partial gradients).
void add_bf16_to_f32(float* y, const bf16* x, size_t n, cudaStream_t stream);

// ---------------------------------------------------------------- embedding
// out[n, :] = wte[tokens[n], :]    (wte bf16 [V, C])
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, cudaStream_t stream);
// Tensor parallelism (vocab-parallel embedding): wte holds the rows of ids
// [v_begin, v_begin + v_rows); out[n, :] = wte[tokens[n] - v_begin, :], or
// zeros when this rank does not hold tokens[n].
void embedding_forward_vocab_slice(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, int v_begin,
                                   int v_rows, cudaStream_t stream);
// Deterministic backward without atomics: the host groups positions by token
// (embedding_backward_plan below); one block per distinct token sums its
// positions' rows in position order and adds the sum into dwte (fp32).
//   uniq[u]                 the u-th distinct token
//   offsets[u]..offsets[u+1] its range in `positions` (ascending positions)
void embedding_backward(float* dwte, const bf16* dout, const int32_t* uniq, const int32_t* offsets,
                        const int32_t* positions, int U, int C, cudaStream_t stream);
// Host helper: fills uniq [<= N], offsets [<= N+1] and positions [N] from
// tokens [N]; returns U. Runs in O(N + V') with a counting pass.
int embedding_backward_plan(const int32_t* tokens, int N, int32_t* uniq, int32_t* offsets, int32_t* positions);

// ---------------------------------------------------------------- RMSNorm
// Fused residual add + RMSNorm (the add is skipped when `b` is null):
//   resid_out = a + b   (written when b is non-null; may alias a)
//   out = RMSNorm(resid_out) * w,  rstd[n] = 1/sqrt(mean(resid_out[n]^2) + eps)
// The normalisation reads the bf16-rounded resid_out, so the backward, which
// only has the stored resid_out, differentiates exactly what the forward did.
void residual_rmsnorm_forward(bf16* resid_out, bf16* out, float* rstd, const bf16* a, const bf16* b, const float* w,
                              int N, int C, float eps, cudaStream_t stream);
// dinp = RMSNorm'(inp)^T dout  (+ dresid when dresid is non-null: the gradient
// arriving through the residual branch). dinp may alias dresid.
// dw (fp32 [C]) += sum_n dout[n] * inp[n] * rstd[n], via scratch.
void rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* dresid, const bf16* inp, const float* w,
                      const float* rstd, int N, int C, float* scratch, cudaStream_t stream);
size_t rmsnorm_backward_scratch_floats(int N, int C);

// ---------------------------------------------------------------- KV shift + RoPE
// One pass over x [B, T, H, D] (row stride ld_in between consecutive (b, t)
// rows; head h at column h*D) writing y (row stride ld_out):
//   s_t = sum_{w=0..W} coef[h, w] * x_{t-W+w}   (x_{<0} = 0; coef null: s = x)
//   y_t = RoPE_t(s_t)                            (cos/sin [T, D/2] fp32; null: no rotation)
// This is the CPU's kv_shift_forward followed by rope_forward, fused so the raw
// K (or V, or Q) is read once. coef is fp32 [H, W+1], oldest first (the engine
// has already applied a sigmoid gate). W is 0 when coef is null.
// y must not alias x when W > 0 (a tile's halo rows are another tile's rows).
// Context parallelism: each of the B sequences is one chunk of a longer one,
// and the raw rows before its position 0 come from the previous chunk.
//   rows:  [B][W] raw rows (bf16, row stride ld, head h at column h*D, oldest
//          first) read as x_{-W} .. x_{-1} (null: zeros);
//   grad:  fp32 [B][W] rows (row stride ld_grad) the backward overwrites with
//          the gradient of those rows (null: not wanted; needs T >= W).
// cos/sin of a chunk that starts at position p are the tables + p * D / 2.
struct ShiftHalo {
  const bf16* rows = nullptr;
  int ld = 0;
  float* grad = nullptr;
  int ld_grad = 0;
};
// The kernels' accesses: 8 bf16 per thread and access (16 bytes, the default)
// or 4 (8 bytes: about half the registers per thread, so more threads per SM;
// bench-attention times both); each falls back to 1 where the shapes or
// alignments do not allow it. y and dx are the same bits either way (the same
// per-element math); dcoef's fp32 partials are grouped differently, so it
// may differ in its last bits.
enum class ShiftRopeVector { k8, k4 };
// How threads cover the rows: kUnits, each thread one unit (V columns, and
// their RoPE partners) of one row at a time, reading the window's W + 1 rows
// of it; kRows, each thread a run of rows of one unit, keeping the window's
// other row in registers, so each row is read once (window W <= 1 and no
// halo; elsewhere kUnits). y and dx are the same bits either way; dcoef's
// partials are grouped differently (last bits).
enum class ShiftRopeWalk { kUnits, kRows };
// doc (device, [B, T] int32, may be null): the row each position's document
// starts at (model.document_boundaries; negative: before this chunk): rows
// before it count as zero history, as kvs::cpu::kv_shift_forward's doc_start.
void shift_rope_forward(bf16* y, int ld_out, const bf16* x, int ld_in, const float* coef, const float* cos,
                        const float* sin, int B, int T, int H, int D, int W, cudaStream_t stream,
                        ShiftHalo halo = {}, ShiftRopeVector vector = ShiftRopeVector::k8,
                        ShiftRopeWalk walk = ShiftRopeWalk::kUnits, const int32_t* doc = nullptr);
// The adjoint: ds = RoPE^T dy; dx_s = sum_w coef[h, w] ds_{s+W-w} (overwritten,
// row stride ld_dx); dcoef (fp32 [H, W+1]) += sum_{b,t,d} ds_t * x_{t-W+w}
// (via scratch; dcoef may be null; W <= 8 when dcoef is wanted). coef null:
// dx = RoPE^T dy. dx must not alias dy when W > 0.
void shift_rope_backward(bf16* dx, int ld_dx, float* dcoef, const bf16* dy, int ld_dy, const bf16* x, int ld_x,
                         const float* coef, const float* cos, const float* sin, int B, int T, int H, int D, int W,
                         float* scratch, cudaStream_t stream, ShiftHalo halo = {},
                         ShiftRopeVector vector = ShiftRopeVector::k8,
                         ShiftRopeWalk walk = ShiftRopeWalk::kUnits, const int32_t* doc = nullptr);
// The owner's side of a halo gradient: dx[b, T - W + j, c] += dtail[b, j, c]
// (bf16 rows of stride ld_dx, fp32 rows of stride ld_tail; c < width), rounded once.
void shift_halo_add(bf16* dx, int ld_dx, const float* dtail, int ld_tail, int B, int T, int width, int W,
                    cudaStream_t stream);
size_t shift_rope_backward_scratch_floats(int B, int T, int H, int D, int W);
// The cos/sin tables [T, D/2] (fp32) are kernels/cpu rope_tables' output,
// computed on the host by the engine and copied once.

// The "sigmoid_gate" parametrisation (window 1): the stored tensor is [H, 2]
// with the gate logit g in column 1; the effective coefficients are
// eff[h] = [1 - sigmoid(g), sigmoid(g)] (column 0 of the stored tensor unused).
void shift_gate_forward(float* eff, const float* stored, int H, cudaStream_t stream);
// dstored[h, 1] += sigmoid'(g) * (deff[h, 1] - deff[h, 0]); column 0 untouched.
void shift_gate_backward(float* dstored, const float* deff, const float* stored, int H, cudaStream_t stream);

// ---------------------------------------------------------------- attention
// Causal flash attention, scale 1/sqrt(D), GQA: query head h reads KV head
// h / (Hq / Hkv); K and V are never copied per query head.
// q [B, T, Hq, D] (row stride ld_q), k and v [B, T, Hkv, D] (row stride ld_kv),
// out [B, T, Hq, D] contiguous; lse fp32 [B, Hq, T] (natural log-sum-exp of the
// scaled scores, saved for the backward). D in {16, 32, 64, 128}.
void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, cudaStream_t stream);
// dq (row stride ld_q), dk and dv (row stride ld_kv) are overwritten; dK/dV are
// summed over the query heads of each group inside one block (deterministic).
// scratch: fp32, flash_attention_backward_scratch_floats() (holds
// delta = rowsum(dout * out) [B, Hq, T]).
void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, float* scratch, cudaStream_t stream);
size_t flash_attention_backward_scratch_floats(int B, int T, int Hq, int D);
// Ring attention (context parallelism) attends a block of T queries to a block
// of T keys: causal (the diagonal block, the forms above) or not (keys of an
// earlier chunk: every key visible). A block's out and lse are partial; the
// backward takes the merged out and lse of the whole row (the softmax over
// every block), so delta and P are the row's, and its dq, dk, dv are this
// block's shares (overwritten).
void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, bool causal, cudaStream_t stream);
// How the flash kernels move their tiles into shared memory (the same bits
// either way): kAsync, the default, by cp.async while the tensor cores work
// (two stages in the backward kernels), fragments read by ldmatrix; kSync,
// every tile through registers and waited for (the first version:
// bench-attention's baseline, and a fallback). kHopper: the Hopper kernels
// (flash_attention_{fwd,bwd}_sm90.cu: every product on wgmma, tiles in its
// swizzled layout; deterministic, but not kAsync's bits on a GPU: another
// accumulation order) where flash_hopper_available(D), else as kAsync.
// kHopperGroups2/3: the Hopper kernels with 2 or 3 warpgroups per block in
// the forward (128 or 192 query rows sharing every K/V tile) and 2 in the
// backward (128 keys sharing the Q/dO tiles in dK/dV, 128 queries sharing
// the K/V tiles in dQ; 3 would not fit an SM's registers), the same bits; no
// documents. bench-attention's comparison until a GPU has measured them.
enum class FlashLoads { kAsync, kSync, kHopper, kHopperGroups2, kHopperGroups3 };
// True when this build has the sm_90a kernels (KVS_CUDA_ARCHS with 90a), the
// current device is compute capability 9.0 and D is 64 or 128.
bool flash_hopper_available(int D);
// Document masks (model.document_boundaries "shift_and_attention"): start
// (device, [B, T] int32; null: none) holds the row each query's document
// starts at (non-decreasing along a sequence), in the queries' row
// coordinates, where key j is row key_row0 + j. Query t sees key j iff
// key_row0 + j >= start[b, t] (and, causal, j <= t), as
// kvs::cpu::attention_forward's doc_start. On one GPU key_row0 = 0; ring
// attention's block of an earlier chunk passes how far that chunk starts
// before the queries' ((kc - qc) Tc): a query whose document starts after
// the block's keys sees none of them (lse -inf, out 0; its backward wants the
// merged, finite lse). kSync runs them as kAsync.
struct AttentionDocs {
  const int32_t* start = nullptr;
  int key_row0 = 0;
};
void flash_attention_forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                             int B, int T, int Hq, int Hkv, int D, bool causal, FlashLoads loads,
                             cudaStream_t stream, AttentionDocs docs = {});
void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, bool causal, FlashLoads loads, float* scratch, cudaStream_t stream,
                              AttentionDocs docs = {});
void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                              const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                              int Hkv, int D, bool causal, float* scratch, cudaStream_t stream);
// The log-sum-exp merge of a block's partial attention into a running one
// (fp32 acc [B, T, Hq, D], acc_lse [B, Hq, T], starting at -inf):
//   lse' = log(exp(acc_lse) + exp(lse)),  acc' = exp(acc_lse - lse') acc + exp(lse - lse') out;
// rows with lse = -inf (no visible key) are left as they are.
void attention_merge(float* acc, float* acc_lse, const bf16* out, const float* lse, int B, int T, int Hq, int D,
                     cudaStream_t stream);

// ---------------------------------------------------------------- SwiGLU
// gate_up [N, 2F]: columns [0, F) gate, [F, 2F) up (the fused projection's output).
// out [N, F] = silu(gate) * up.
void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream);
// dgate_up [N, 2F] (overwritten) from dout [N, F].
void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream);

// ---------------------------------------------------------------- loss
// Fused masked cross-entropy over logits bf16 [N, V] (row stride V), one block
// per row, fp32 online max/sum (no fp32 probability buffer):
//   losses[n] = mask[n] * (logsumexp(logits[n]) - logits[n, targets[n]])  (fp32)
//   dlogits[n] = mask[n] * grad_scale * (softmax(logits[n]) - onehot(targets[n]))  (bf16;
//                may alias logits; skipped when null)
//   argmax[n] = first index of the row maximum (skipped when null).
// mask null = all ones; a row with mask 0 does not read its target.
void cross_entropy_forward_backward(float* losses, bf16* dlogits, int32_t* argmax, const bf16* logits,
                                    const int32_t* targets, const float* mask, int N, int V, float grad_scale,
                                    cudaStream_t stream);
// Deterministic sum of x[0..n) in fp64 written to *out (device): fixed blocks, fixed order.
void sum_f32(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream);
size_t sum_scratch_doubles(size_t n);

// ---------------------------------------------------------------- optimizer
// *out = sum of g[i]^2 over [0, n) in fp64, deterministic (same bits every run).
void sum_squares_f32(double* out, const float* g, size_t n, double* scratch, cudaStream_t stream);

// One AdamW step over every parameter in one launch (multi-tensor): chunks of
// the flat fp32 buffers, each chunk inside one tensor, described by a device
// table built once (AdamWChunk). Per element, as CpuEngine::adamw_step:
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p = p * (decay ? 1 - lr*wd : 1) - (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
//   clamp01 tensors: p = clamp(p, 0, 1);   param_bf16[i] = bf16(p)
struct AdamWChunk {
  uint64_t begin, end;  // element range in the flat buffers
  uint32_t flags;       // kAdamWDecay | kAdamWClamp01
};
constexpr uint32_t kAdamWDecay = 1, kAdamWClamp01 = 2;
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^step, computed in double on the host
  float grad_scale;
};
void adamw_step(float* master, bf16* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq,
                const AdamWChunk* chunks, int num_chunks, const AdamWArgs& a, cudaStream_t stream);
constexpr uint64_t kAdamWChunkElems = 1 << 16;

}  // namespace kvs::cuda
