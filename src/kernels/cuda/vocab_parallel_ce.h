// The masked cross-entropy when the LM head is split by vocabulary across a
// tensor-parallel group (Megatron's vocab-parallel cross-entropy) on the GPU:
// the same math as kvs::vocab_parallel_cross_entropy (model/
// vocab_parallel_loss.h), as three kernels around the caller's all-reduces,
// because no rank holds a full row of logits:
//
//   vocab_parallel_ce_local   one sweep of each local row: local max, sum of
//                             exp(x - local max), first local argmax, the
//                             target's logit if this rank owns it;
//   [all-reduce Max of stats.gmax]
//   vocab_parallel_ce_rescale the local sum moved to the global max, the
//                             argmax candidate (minus its global id, or -inf);
//   [all-reduce Sum of stats.sums (2N: sums then target logits), Max of
//    stats.cand when the argmax is wanted]
//   vocab_parallel_ce_finish  losses, argmax and, re-reading the row,
//                             dlogits = (softmax - onehot) * mask * grad_scale.
//
// Columns at or after `valid` (this rank's share of the vocabulary padding)
// take part in nothing and get a zero gradient. dlogits may alias logits.
// The fp32 statistics live in one device buffer of 6 N floats (VocabCeStats).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvs::cuda {

struct VocabCeStats {
  float* gmax;   // [N] local max, all-reduced (Max) into the global max
  float* lmax;   // [N] local max (kept)
  float* sums;   // [2N] sum of exp (local, then rescaled), then the target logit (0 where not owned)
  float* cand;   // [N] local argmax, then minus its global id or -inf; all-reduced (Max)
  float* lsum;   // [N] sum of exp relative to the local max
  static VocabCeStats at(float* base, size_t N) { return {base, base + N, base + 2 * N, base + 4 * N, base + 5 * N}; }
  static size_t floats(size_t N) { return 6 * N; }
};

void vocab_parallel_ce_local(VocabCeStats st, const __nv_bfloat16* logits, const int32_t* targets, const float* mask,
                             int N, int V, int valid, int v_begin, bool want_argmax, cudaStream_t stream);
void vocab_parallel_ce_rescale(VocabCeStats st, const float* mask, int N, int v_begin, cudaStream_t stream);
void vocab_parallel_ce_finish(float* losses, __nv_bfloat16* dlogits, int32_t* argmax, VocabCeStats st,
                              const __nv_bfloat16* logits, const int32_t* targets, const float* mask, int N, int V,
                              int valid, int v_begin, float grad_scale, cudaStream_t stream);

}  // namespace kvs::cuda
