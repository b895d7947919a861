// SwiGLU on the fused gate/up projection gate_up [N, 2F] (gate columns
// [0, F), up columns [F, 2F)): out = silu(gate) * up, and its backward.
//
// Both kernels are elementwise over the N x F output: thread i handles chunk i
// of V consecutive columns of one row (chunks numbered row-major, so a warp
// covers contiguous spans of the gate half and of the up half), in a
// grid-stride loop. V = 8 (16-byte loads and stores) when F % 8 == 0 and the
// pointers are 16-byte aligned, V = 1 otherwise. The math is fp32 with the
// accurate expf (these kernels are memory bound either way).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {



__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// out[n, j] = silu(gate[n, j]) * up[n, j]
template <int V>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate_up, int N, int F) {
  const int chunks_per_row = F / V;
  const size_t total = (size_t)N * chunks_per_row;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t n = i / chunks_per_row;
    const int j = (int)(i % chunks_per_row) * V;
    const bf16* gu = gate_up + n * 2 * F;
    float g[V], u[V], y[V];
    load_bf16<V>(g, gu + j);
    load_bf16<V>(u, gu + F + j);
#pragma unroll
    for (int k = 0; k < V; ++k) y[k] = g[k] * sigmoid(g[k]) * u[k];
    store_bf16<V>(out + n * F + j, y);
  }
}

// dgate = dout * up * sig * (1 + g * (1 - sig)),  dup = dout * silu(g)   (overwritten)
template <int V>
__global__ void swiglu_backward_kernel(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F) {
  const int chunks_per_row = F / V;
  const size_t total = (size_t)N * chunks_per_row;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t n = i / chunks_per_row;
    const int j = (int)(i % chunks_per_row) * V;
    const bf16* gu = gate_up + n * 2 * F;
    float g[V], u[V], dy[V], dg[V], du[V];
    load_bf16<V>(g, gu + j);
    load_bf16<V>(u, gu + F + j);
    load_bf16<V>(dy, dout + n * F + j);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float sig = sigmoid(g[k]);
      dg[k] = dy[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));
      du[k] = dy[k] * g[k] * sig;
    }
    bf16* dgu = dgate_up + n * 2 * F;
    store_bf16<V>(dgu + j, dg);
    store_bf16<V>(dgu + F + j, du);
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(size_t chunks) {
  return (unsigned)std::min<size_t>((chunks + kThreads - 1) / kThreads, 1u << 16);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 == 0 && aligned16(out) && aligned16(gate_up)) {
    swiglu_forward_kernel<8><<<blocks_for((size_t)N * F / 8), kThreads, 0, stream>>>(out, gate_up, N, F);
  } else {
    swiglu_forward_kernel<1><<<blocks_for((size_t)N * F), kThreads, 0, stream>>>(out, gate_up, N, F);
  }
  KVS_CUDA_LAUNCH_CHECK("swiglu_forward_kernel", stream);
}

void swiglu_backward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int N, int F, cudaStream_t stream) {
  if (N <= 0 || F <= 0) return;
  if (F % 8 == 0 && aligned16(dgate_up) && aligned16(dout) && aligned16(gate_up)) {
    swiglu_backward_kernel<8><<<blocks_for((size_t)N * F / 8), kThreads, 0, stream>>>(dgate_up, dout, gate_up, N, F);
  } else {
    swiglu_backward_kernel<1><<<blocks_for((size_t)N * F), kThreads, 0, stream>>>(dgate_up, dout, gate_up, N, F);
  }
  KVS_CUDA_LAUNCH_CHECK("swiglu_backward_kernel", stream);
}

}  // namespace kvs::cuda
