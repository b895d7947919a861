// Fused masked cross-entropy: loss, dlogits and argmax in two sweeps over each
// row of bf16 logits (see ops.h for the contract).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/softmax_stats.cuh"

namespace kvs::cuda {

namespace {

// W consecutive bf16 loaded or stored as one access (W = 8: 16 bytes).
template <int W>
struct alignas(2 * W) Bf16Pack {
  bf16 v[W];
};

// One block per row n. Sweep 1 keeps per-thread online statistics (max,
// sum of exp relative to the running max, first argmax) over the thread's
// strided share of the row, in fp32, and merges them across the block; the
// row is read once and no fp32 probability buffer exists. Sweep 2 re-reads the
// logits and writes dlogits = k * exp(x - max) (minus mask * grad_scale at the
// target), with k = mask * grad_scale / sum. Each thread writes exactly the
// elements it read, after the block-wide merge (a __syncthreads), and the
// target logit is read by thread 0 before sweep 1, so dlogits may alias logits.
// W = 8 moves 16 bytes per access (rows must then be 16-byte aligned: V % 8 == 0
// and aligned base pointers); W = 1 handles any V. A masked row (mask 0) never
// reads its target, gets loss 0 and a zero gradient row; it is still swept
// once when argmax is wanted, as on the CPU.
template <int W>
__global__ void cross_entropy_kernel(float* losses, bf16* dlogits, int32_t* argmax, const bf16* logits,
                                     const int32_t* targets, const float* mask, int V, float grad_scale) {
  using Pack = Bf16Pack<W>;
  const int row = blockIdx.x;
  const size_t offset = size_t(row) * V;
  const Pack* x = reinterpret_cast<const Pack*>(logits + offset);
  const int packs = V / W;
  const float mk = mask ? mask[row] : 1.0f;
  const bool active = mk != 0.0f;

  int target = -1;
  float x_target = 0.0f;
  if (active) {
    target = targets[row];
    if (threadIdx.x == 0) x_target = to_f32(logits[offset + target]);  // before anything is written
  }

  RowStats st{-INFINITY, 0.0f, INT_MAX};
  if (active || argmax) {
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const Pack pk = x[p];
#pragma unroll
      for (int j = 0; j < W; ++j) {
        push(st, to_f32(pk.v[j]), p * W + j);
      }
    }
    st = block_merge(st);  // ends every read of sweep 1 (contains __syncthreads)
  }

  if (threadIdx.x == 0) {
    if (argmax) argmax[row] = st.idx;
    if (losses) losses[row] = active ? mk * ((st.m - x_target) + logf(st.s)) : 0.0f;
  }
  if (!dlogits) return;

  Pack* dx = reinterpret_cast<Pack*>(dlogits + offset);
  if (!active) {
    Pack zero;
#pragma unroll
    for (int j = 0; j < W; ++j) zero.v[j] = to_bf16(0.0f);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) dx[p] = zero;
    return;
  }
  const float mg = mk * grad_scale;
  const float k = mg / st.s;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack pk = x[p];
    Pack out;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      float d = expf(to_f32(pk.v[j]) - st.m) * k;
      if (p * W + j == target) d -= mg;
      out.v[j] = to_bf16(d);
    }
    dx[p] = out;
  }
}

}  // namespace

void cross_entropy_forward_backward(float* losses, bf16* dlogits, int32_t* argmax, const bf16* logits,
                                    const int32_t* targets, const float* mask, int N, int V, float grad_scale,
                                    cudaStream_t stream) {
  if (N <= 0) return;
  if (V <= 0) fail("cross_entropy_forward_backward: vocabulary size {} must be positive", V);
  const bool vec = V % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                   (!dlogits || reinterpret_cast<uintptr_t>(dlogits) % 16 == 0);
  const int items = vec ? V / 8 : V;
  // Enough threads for the row, in whole warps, at most 512 (a few blocks per SM).
  const int threads = std::min(512, int(ceil_div(size_t(items), 32)) * 32);
  if (vec) {
    cross_entropy_kernel<8><<<N, threads, 0, stream>>>(losses, dlogits, argmax, logits, targets, mask, V, grad_scale);
  } else {
    cross_entropy_kernel<1><<<N, threads, 0, stream>>>(losses, dlogits, argmax, logits, targets, mask, V, grad_scale);
  }
  KVS_CUDA_LAUNCH_CHECK("cross_entropy_kernel", stream);
}

}  // namespace kvs::cuda
