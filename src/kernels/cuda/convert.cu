// Conversions between fp32 and bf16, fills, and fp32 accumulation (add_f32, add_bf16_to_f32). Pure streaming kernels over a
// flat array with a grid-stride loop. When both pointers are 16-byte aligned
// (checked on the host; cudaMalloc'd buffers are) each thread moves chunks of
// 8 elements through 16-byte accesses and the last n % 8 elements go one per
// thread; otherwise every element goes one per thread, still coalesced.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1u << 16;  // the kernels grid-stride beyond this


// Blocks for `items` units of work at kThreads per block, capped.
unsigned blocks_for(size_t items) {
  const size_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ size_t thread_index() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t grid_threads() { return (size_t)gridDim.x * blockDim.x; }

// fp32 -> bf16, round to nearest even. Vector chunk: two float4 loads, one 16-byte store.
template <bool kVec>
__global__ void f32_to_bf16_kernel(bf16* out, const float* in, size_t n) {
  size_t done = 0;
  if constexpr (kVec) {
    const size_t chunks = n / 8;
    for (size_t c = thread_index(); c < chunks; c += grid_threads()) {
      const float4 a = reinterpret_cast<const float4*>(in)[2 * c];
      const float4 b = reinterpret_cast<const float4*>(in)[2 * c + 1];
      uint4 packed;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&packed);
      h[0] = __floats2bfloat162_rn(a.x, a.y);
      h[1] = __floats2bfloat162_rn(a.z, a.w);
      h[2] = __floats2bfloat162_rn(b.x, b.y);
      h[3] = __floats2bfloat162_rn(b.z, b.w);
      reinterpret_cast<uint4*>(out)[c] = packed;
    }
    done = chunks * 8;
  }
  for (size_t i = done + thread_index(); i < n; i += grid_threads()) out[i] = to_bf16(in[i]);
}

// bf16 -> fp32 (exact). Vector chunk: one 16-byte load, two float4 stores.
template <bool kVec>
__global__ void bf16_to_f32_kernel(float* out, const bf16* in, size_t n) {
  size_t done = 0;
  if constexpr (kVec) {
    const size_t chunks = n / 8;
    for (size_t c = thread_index(); c < chunks; c += grid_threads()) {
      const uint4 packed = reinterpret_cast<const uint4*>(in)[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
      const float2 f0 = __bfloat1622float2(h[0]), f1 = __bfloat1622float2(h[1]);
      const float2 f2 = __bfloat1622float2(h[2]), f3 = __bfloat1622float2(h[3]);
      reinterpret_cast<float4*>(out)[2 * c] = make_float4(f0.x, f0.y, f1.x, f1.y);
      reinterpret_cast<float4*>(out)[2 * c + 1] = make_float4(f2.x, f2.y, f3.x, f3.y);
    }
    done = chunks * 8;
  }
  for (size_t i = done + thread_index(); i < n; i += grid_threads()) out[i] = to_f32(in[i]);
}

// Fills: one element per thread per step (coalesced). Fills initialise
// buffers; they are not on the training step's hot path.
template <class T>
__global__ void fill_kernel(T* out, T value, size_t n) {
  for (size_t i = thread_index(); i < n; i += grid_threads()) out[i] = value;
}

// y[i] += x[i] (fp32): one element per thread, grid-stride.
__global__ void add_f32_kernel(float* y, const float* x, size_t n) {
  for (size_t i = thread_index(); i < n; i += grid_threads()) y[i] += x[i];
}

// y[i] += float(x[i]).
__global__ void add_bf16_to_f32_kernel(float* y, const bf16* x, size_t n) {
  for (size_t i = thread_index(); i < n; i += grid_threads()) y[i] += __bfloat162float(x[i]);
}

}  // namespace

void f32_to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (aligned16(out) && aligned16(in) && n >= 8) {
    f32_to_bf16_kernel<true><<<blocks_for(n / 8), kThreads, 0, stream>>>(out, in, n);
  } else {
    f32_to_bf16_kernel<false><<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  }
  KVS_CUDA_LAUNCH_CHECK("f32_to_bf16_kernel", stream);
}

void bf16_to_f32(float* out, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (aligned16(out) && aligned16(in) && n >= 8) {
    bf16_to_f32_kernel<true><<<blocks_for(n / 8), kThreads, 0, stream>>>(out, in, n);
  } else {
    bf16_to_f32_kernel<false><<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  }
  KVS_CUDA_LAUNCH_CHECK("bf16_to_f32_kernel", stream);
}

void fill_f32(float* out, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(out, value, n);
  KVS_CUDA_LAUNCH_CHECK("fill_kernel<float>", stream);
}

void fill_bf16(bf16* out, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<bf16><<<blocks_for(n), kThreads, 0, stream>>>(out, __float2bfloat16_rn(value), n);
  KVS_CUDA_LAUNCH_CHECK("fill_kernel<bf16>", stream);
}

void add_f32(float* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  KVS_CUDA_LAUNCH_CHECK("add_f32_kernel", stream);
}

void add_bf16_to_f32(float* y, const bf16* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  KVS_CUDA_LAUNCH_CHECK("add_bf16_to_f32_kernel", stream);
}

}  // namespace kvs::cuda
