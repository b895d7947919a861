// Shared device helpers for the CUDA kernels: error checks, bf16 <-> fp32,
// warp and block reductions. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/device.h"

namespace kvs::cuda {

// A CUDA API call that must succeed; the message names the call and the file.
#define KVS_CUDA_CHECK(call)                                                                                     \
  do {                                                                                                           \
    const cudaError_t kvs_err_ = (call);                                                                         \
    if (kvs_err_ != cudaSuccess)                                                                                 \
      ::kvs::fail("CUDA error in {} ({}:{}): {}", #call, __FILE__, __LINE__, cudaGetErrorString(kvs_err_));     \
  } while (0)

// After a kernel launch on `stream`: a bad configuration fails here, naming
// the kernel; with KVS_CUDA_SYNC=1 a fault inside the kernel too; with the
// per-kernel profile on, the kernel's end is marked (device.h, check_launch).
#define KVS_CUDA_LAUNCH_CHECK(kernel_name, stream) ::kvs::cuda::check_launch(kernel_name, stream)

inline unsigned ceil_div(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `smem` holds 32 values. Fixed order: deterministic.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : T(0);
  return warp_sum(v);
}

}  // namespace kvs::cuda
