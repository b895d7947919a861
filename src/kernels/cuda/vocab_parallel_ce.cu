// Vocab-parallel cross-entropy kernels (contract in vocab_parallel_ce.h).
// Shaped like the fused single-GPU loss (cross_entropy.cu): one block per
// row, fp32 online statistics over the row in one read, a fixed-order block
// merge (deterministic); the row is read a second time only to write dlogits.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax_stats.cuh"
#include "kernels/cuda/vocab_parallel_ce.h"

namespace kvs::cuda {

namespace {

using bf16 = __nv_bfloat16;

// Sweep of row n over its `valid` real columns (scalar loads: the local row
// is short next to the matmul that produced it, and `valid` cuts packs).
__global__ void local_kernel(VocabCeStats st, const bf16* logits, const int32_t* targets, const float* mask, int V,
                             int valid, int v_begin, bool want_argmax) {
  const int row = blockIdx.x;
  const bf16* x = logits + size_t(row) * V;
  const float mk = mask ? mask[row] : 1.0f;
  const bool active = mk != 0.0f;
  RowStats o{-INFINITY, 0.0f, INT_MAX};
  if (active || want_argmax) {
    for (int v = threadIdx.x; v < valid; v += blockDim.x) push(o, to_f32(x[v]), v);
    o = block_merge(o);
  }
  if (threadIdx.x != 0) return;
  const int N = gridDim.x;
  st.gmax[row] = o.m;
  st.lmax[row] = o.m;
  st.lsum[row] = active ? o.s : 0.0f;
  st.cand[row] = o.idx == INT_MAX ? -1.0f : float(o.idx);
  const int t = active ? targets[row] - v_begin : -1;
  st.sums[N + row] = t >= 0 && t < valid ? to_f32(x[t]) : 0.0f;
}

// Elementwise over rows, after the Max all-reduce of gmax.
__global__ void rescale_kernel(VocabCeStats st, const float* mask, int N, int v_begin) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const float g = st.gmax[row], l = st.lmax[row], s = st.lsum[row];
  const bool active = (mask ? mask[row] : 1.0f) != 0.0f;
  st.sums[row] = active && s != 0.0f ? s * expf(l - g) : 0.0f;
  const float idx = st.cand[row];
  st.cand[row] = idx >= 0.0f && l == g ? -(float(v_begin) + idx) : -INFINITY;
}

// After the Sum (and Max) all-reduces: row statistics are global.
__global__ void finish_kernel(float* losses, bf16* dlogits, int32_t* argmax, VocabCeStats st, const bf16* logits,
                              const int32_t* targets, const float* mask, int V, int valid, int v_begin,
                              float grad_scale) {
  const int row = blockIdx.x, N = gridDim.x;
  const float mk = mask ? mask[row] : 1.0f;
  const bool active = mk != 0.0f;
  const float g = st.gmax[row], S = st.sums[row];
  if (threadIdx.x == 0) {
    if (losses) losses[row] = active ? mk * ((g - st.sums[N + row]) + logf(S)) : 0.0f;
    if (argmax) argmax[row] = int32_t(-st.cand[row]);
  }
  if (!dlogits) return;
  const bf16* x = logits + size_t(row) * V;
  bf16* dx = dlogits + size_t(row) * V;
  const int t = active ? targets[row] - v_begin : -1;
  const float mg = mk * grad_scale, k = active ? mg / S : 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float d = 0.0f;
    if (active && v < valid) {
      d = expf(to_f32(x[v]) - g) * k;
      if (v == t) d -= mg;
    }
    dx[v] = to_bf16(d);  // each thread writes only what it read
  }
}

int row_threads(int V) {
  const int t = int(ceil_div(size_t(V > 0 ? V : 1), 32)) * 32;
  return t < 32 ? 32 : (t > 512 ? 512 : t);
}

}  // namespace

void vocab_parallel_ce_local(VocabCeStats st, const bf16* logits, const int32_t* targets, const float* mask, int N,
                             int V, int valid, int v_begin, bool want_argmax, cudaStream_t stream) {
  if (N <= 0) return;
  KVS_CHECK(V > 0 && valid >= 0 && valid <= V, "vocab_parallel_ce: {} valid columns of {}", valid, V);
  local_kernel<<<N, row_threads(V), 0, stream>>>(st, logits, targets, mask, V, valid, v_begin, want_argmax);
  KVS_CUDA_LAUNCH_CHECK("vocab_parallel_ce local_kernel", stream);
}

void vocab_parallel_ce_rescale(VocabCeStats st, const float* mask, int N, int v_begin, cudaStream_t stream) {
  if (N <= 0) return;
  rescale_kernel<<<ceil_div(size_t(N), 256), 256, 0, stream>>>(st, mask, N, v_begin);
  KVS_CUDA_LAUNCH_CHECK("vocab_parallel_ce rescale_kernel", stream);
}

void vocab_parallel_ce_finish(float* losses, bf16* dlogits, int32_t* argmax, VocabCeStats st, const bf16* logits,
                              const int32_t* targets, const float* mask, int N, int V, int valid, int v_begin,
                              float grad_scale, cudaStream_t stream) {
  if (N <= 0) return;
  finish_kernel<<<N, row_threads(V), 0, stream>>>(losses, dlogits, argmax, st, logits, targets, mask, V, valid,
                                                  v_begin, grad_scale);
  KVS_CUDA_LAUNCH_CHECK("vocab_parallel_ce finish_kernel", stream);
}

}  // namespace kvs::cuda
