// CPU reference kernels: the signatures every backend implements.
//
// Each op is a template on the scalar type so the finite-difference tests can
// run it in double; the model instantiates it with float. Conventions (as in
// llm.c): tensors are contiguous row-major; shapes are given as ints;
// every *_backward ACCUMULATES (+=) into the gradients it writes (input and
// parameter gradients alike), so callers zero gradient buffers first and a
// tensor used twice just receives two contributions. A null gradient pointer
// means "not needed". All ops are deterministic for a fixed thread count:
// OpenMP splits work so that no two threads add into the same element.
//
// Layouts: activations [B, T, H, D] = [B*T rows, H*D columns]; linear weights
// [out, in] as in Hugging Face (y = x W^T); attention probabilities [B, Hq, T, T].
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvs::cpu {

// out[n, :] = wte[tokens[n], :]
// Vocabulary-parallel form: wte holds rows [v_begin, v_begin + v_count) only,
// and rows of tokens outside them are 0 (the TP group sums the ranks' outputs).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, int v_begin = 0,
                       int v_count = INT32_MAX);
// dwte[tokens[n], :] += dout[n, :]
// (vocabulary-parallel: only tokens in [v_begin, v_begin + v_count), into dwte's local rows)
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C, int v_begin = 0,
                        int v_count = INT32_MAX);

// RMSNorm over the last dimension: rstd[n] = 1/sqrt(mean(inp[n]^2) + eps),
// out[n, c] = inp[n, c] * rstd[n] * w[c].
template <class T> void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C);

// out[N, OC] = inp[N, C] @ W[OC, C]^T  (overwrites out). float uses OpenBLAS sgemm.
template <class T> void matmul_forward(T* out, const T* inp, const T* W, int N, int C, int OC);
// dinp[N, C] += dout @ W ; dW[OC, C] += dout^T @ inp
template <class T>
void matmul_backward(T* dinp, T* dW, const T* dout, const T* inp, const T* W, int N, int C, int OC);

// KV shifting (generalised to a window of W past positions):
// out[b, t, h, :] = sum_{w=0..W} coef[h, w] * in[b, t - W + w, h, :], with in[b, t<0] = 0.
// coef is [H, W+1], oldest position first (window 1: coef[h,0] weights t-1, coef[h,1] weights t).
// Document boundaries: with doc_start ([B, T], the first position of t's
// document within its sequence) the rows before doc_start[b, t] count as zero
// too, so the shift restarts at every document as at the sequence start.
template <class T>
void kv_shift_forward(T* out, const T* in, const T* coef, int B, int Tn, int H, int D, int W,
                      const int32_t* doc_start = nullptr);
template <class T>
void kv_shift_backward(T* din, T* dcoef, const T* dout, const T* in, const T* coef, int B, int Tn, int H, int D, int W,
                       const int32_t* doc_start = nullptr);

// RoPE tables in Hugging Face's convention, computed in fp32 like HF:
// inv_freq[i] = 1 / theta^(2i/D), angle[t, i] = float(t) * inv_freq[i], i < D/2.
// cos/sin are [Tn, D/2].
template <class T> void rope_tables(T* cos, T* sin, int Tn, int D, double theta);
// rotate_half convention: x1 = x[:D/2], x2 = x[D/2:];
// out1 = x1*cos - x2*sin ; out2 = x2*cos + x1*sin.  out may alias in.
template <class T> void rope_forward(T* out, const T* in, const T* cos, const T* sin, int B, int Tn, int H, int D);
// din += R^T dout (the inverse rotation of dout).
template <class T> void rope_backward(T* din, const T* dout, const T* cos, const T* sin, int B, int Tn, int H, int D);

// Causal grouped-query attention with scale 1/sqrt(D). q/out are [B, T, Hq, D],
// k/v are [B, T, Hkv, D]; query head h reads KV head h / (Hq / Hkv) (K/V are
// never copied per query head). att [B, Hq, T, T] receives the softmax
// probabilities (entries above the diagonal are written as 0). With doc_start
// ([B, T], as for kv_shift) query t attends to keys [doc_start[b, t], t] only
// (document masking); the probabilities outside are 0, so the backward needs
// nothing more.
template <class T>
void attention_forward(T* out, T* att, const T* q, const T* k, const T* v, int B, int Tn, int Hq, int Hkv, int D,
                       const int32_t* doc_start = nullptr);
// datt is scratch of the same shape as att (overwritten).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, T* datt, const T* dout, const T* q, const T* k, const T* v,
                        const T* att, int B, int Tn, int Hq, int Hkv, int D);

// SwiGLU: out = silu(gate) * up, elementwise over n.
template <class T> void swiglu_forward(T* out, const T* gate, const T* up, size_t n);
template <class T> void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n);

// out = a + b (out may alias a).
template <class T> void residual_forward(T* out, const T* a, const T* b, size_t n);

// Masked cross-entropy over rows of logits [N, V]:
// losses[n] = mask[n] * (logsumexp(logits[n]) - logits[n, targets[n]]).
// If dlogits is non-null it is set (overwritten) to
// mask[n] * grad_scale * (softmax(logits[n]) - onehot(targets[n])); it may alias logits.
// If argmax is non-null it receives each row's argmax (first maximum).
template <class T>
void cross_entropy_forward_backward(T* losses, T* dlogits, int32_t* argmax, const T* logits, const int32_t* targets,
                                    const float* mask, int N, int V, double grad_scale);

}  // namespace kvs::cpu

#include "kernels/cpu/ops_impl.h"  // template definitions
