// RMSNorm with a fused residual add, and its backward with a deterministic
// two-pass reduction for the weight gradient.
//
// Both kernels give a row of C channels to one block. A thread owns the
// columns c = V * (threadIdx.x + k * blockDim.x) .. + V - 1 for k = 0, 1, ...:
// V = 8 (16-byte bf16 loads/stores, float4 weight loads) when C % 8 == 0 and
// the pointers are 16-byte aligned, V = 1 otherwise. Every sum runs in fp32.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {



// Threads for one row: one per V-chunk, rounded up to a warp, at most 1024
// (wider rows loop). The kernels carry __launch_bounds__(1024) so that ptxas
// keeps them at <= 64 registers and a 1024-thread launch always fits the
// 64K-register file (without it a larger register count would make the launch
// fail with "too many resources requested" on wide rows only). Depends on C only (it assumes V = 8 when C % 8 == 0, even
// if unaligned pointers later force V = 1), so the backward's block count and
// scratch size are functions of (N, C) alone.
int row_threads(int C) {
  const int chunks = C % 8 == 0 ? C / 8 : C;
  return std::clamp((chunks + 31) / 32 * 32, 32, 1024);
}

// Blocks of the backward: enough to fill an H100 (132 SMs x 2048 threads ~ 2^18
// threads) but no more than N. Fixed by (N, C), never by the device, so the
// dw summation order, hence its bits, are the same on every GPU.
constexpr int kBackwardTargetThreads = 1 << 18;
int backward_blocks(int N, int C) { return std::max(1, std::min(N, kBackwardTargetThreads / row_threads(C))); }

// Forward: block n normalises row n. Pass 1 forms x = bf16(a + b) (or x = a),
// writes it to resid_out and sums x^2 in fp32; a block reduction gives rstd.
// Pass 2 re-reads x (from resid_out: the thread reads back what it wrote
// itself, so the norm sees exactly the stored bf16 values, as the backward
// will) and writes out = (x * rstd) * w. No __restrict__: resid_out may alias a.
template <int V>
__global__ void __launch_bounds__(1024) residual_rmsnorm_forward_kernel(bf16* resid_out, bf16* out, float* rstd, const bf16* a, const bf16* b,
                                                const float* w, int C, float eps) {
  __shared__ float red[32];
  const size_t row = (size_t)blockIdx.x * C;
  float ss = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float x[V];
    load_bf16<V>(x, a + row + c);
    if (b) {
      float y[V];
      load_bf16<V>(y, b + row + c);
#pragma unroll
      for (int k = 0; k < V; ++k) x[k] = to_f32(to_bf16(x[k] + y[k]));
      store_bf16<V>(resid_out + row + c, x);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) ss += x[k] * x[k];
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / (float)C + eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = r;
  const bf16* xrow = (b ? resid_out : a) + row;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float x[V], wc[V];
    load_bf16<V>(x, xrow + c);
    load_f32<V>(wc, w + c);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = (x[k] * r) * wc[k];
    store_bf16<V>(out + row + c, x);
  }
}

// Backward: block j handles rows j, j + G, j + 2G, ... (G = gridDim.x =
// backward_blocks). Per row, pass 1 sums dot = sum_c g w x (block reduction)
// and adds g x rstd into the block's own dw partial, a [C] fp32 array in
// shared memory in which each thread only touches its own columns; pass 2
// writes dinp = rstd w g - (rstd^3 dot / C) x (+ dresid, read before dinp is
// written by the same thread, so dinp may alias dresid). At the end the block
// stores its partial as row j of scratch [G, C]; rmsnorm_dw_reduce_kernel adds
// the G rows into dw in a fixed order. No __restrict__: dinp may alias dresid.
template <int V>
__global__ void __launch_bounds__(1024) rmsnorm_backward_kernel(bf16* dinp, float* dw_partial, const bf16* dout, const bf16* dresid,
                                        const bf16* inp, const float* w, const float* rstd, int N, int C) {
  extern __shared__ __align__(16) float dw_acc[];  // [C], only when dw_partial
  __shared__ float red[32];
  if (dw_partial) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw_acc[c] = 0.0f;
    __syncthreads();
  }
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const size_t row = (size_t)n * C;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
      float g[V], x[V], wc[V];
      load_bf16<V>(g, dout + row + c);
      load_bf16<V>(x, inp + row + c);
      if (dinp) {
        load_f32<V>(wc, w + c);
#pragma unroll
        for (int k = 0; k < V; ++k) dot += g[k] * wc[k] * x[k];
      }
      if (dw_partial) {
        float acc[V];
        load_f32<V>(acc, dw_acc + c);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += g[k] * x[k] * r;
        store_f32<V>(dw_acc + c, acc);
      }
    }
    if (!dinp) continue;  // dw only (uniform across the block)
    dot = block_sum(dot, red);
    const float kx = r * r * r * dot / (float)C;
    for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
      float g[V], x[V], wc[V], dx[V];
      load_bf16<V>(g, dout + row + c);
      load_bf16<V>(x, inp + row + c);
      load_f32<V>(wc, w + c);
      if (dresid) {
        load_bf16<V>(dx, dresid + row + c);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) dx[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) dx[k] += r * wc[k] * g[k] - kx * x[k];
      store_bf16<V>(dinp + row + c, dx);
    }
  }
  if (dw_partial) {
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw_partial[(size_t)blockIdx.x * C + c] = dw_acc[c];
  }
}

// dw[c] += sum_j partial[j, c] over the G block partials, in a fixed order.
// Block of 32 x 32 threads for 32 consecutive columns: threadIdx.x picks the
// column (coalesced rows of partial), threadIdx.y sums the rows j = y, y + 32,
// ... in order; then row y = 0 adds the 32 slices in order y = 0..31.
__global__ void __launch_bounds__(1024) rmsnorm_dw_reduce_kernel(float* dw, const float* partial, int G, int C) {
  __shared__ float slice[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C)
    for (int j = threadIdx.y; j < G; j += 32) acc += partial[(size_t)j * C + c];
  slice[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
    for (int y = 0; y < 32; ++y) sum += slice[y][threadIdx.x];
    dw[c] += sum;
  }
}

}  // namespace

void residual_rmsnorm_forward(bf16* resid_out, bf16* out, float* rstd, const bf16* a, const bf16* b, const float* w,
                              int N, int C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const bool vec = C % 8 == 0 && aligned16(a) && aligned16(out) && aligned16(w) &&
                   (!b || (aligned16(b) && aligned16(resid_out)));
  if (vec) {
    residual_rmsnorm_forward_kernel<8><<<N, row_threads(C), 0, stream>>>(resid_out, out, rstd, a, b, w, C, eps);
  } else {
    residual_rmsnorm_forward_kernel<1><<<N, row_threads(C), 0, stream>>>(resid_out, out, rstd, a, b, w, C, eps);
  }
  KVS_CUDA_LAUNCH_CHECK("residual_rmsnorm_forward_kernel", stream);
}

size_t rmsnorm_backward_scratch_floats(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return (size_t)backward_blocks(N, C) * C;
}

void rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* dresid, const bf16* inp, const float* w,
                      const float* rstd, int N, int C, float* scratch, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const int G = backward_blocks(N, C);
  float* partial = dw ? scratch : nullptr;
  KVS_CHECK(!dw || scratch, "rmsnorm_backward: dw needs scratch of rmsnorm_backward_scratch_floats() floats");
  const size_t smem = dw ? (size_t)C * sizeof(float) : 0;
  if (!dinp && !dw) return;
  const bool vec = C % 8 == 0 && (!dinp || aligned16(dinp)) && aligned16(dout) && aligned16(inp) && aligned16(w) &&
                   (!dresid || aligned16(dresid));
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      KVS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<G, row_threads(C), smem, stream>>>(dinp, partial, dout, dresid, inp, w, rstd, N, C);
  };
  if (vec) {
    launch(rmsnorm_backward_kernel<8>);
  } else {
    launch(rmsnorm_backward_kernel<1>);
  }
  KVS_CUDA_LAUNCH_CHECK("rmsnorm_backward_kernel", stream);
  if (dw) {
    rmsnorm_dw_reduce_kernel<<<ceil_div(C, 32), dim3(32, 32), 0, stream>>>(dw, partial, G, C);
    KVS_CUDA_LAUNCH_CHECK("rmsnorm_dw_reduce_kernel", stream);
  }
}

}  // namespace kvs::cuda
