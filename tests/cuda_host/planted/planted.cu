// Kernels and launches that break a GPU's rules on purpose, for the
// planted-misuse tests (tests/cuda_host/test_contracts.cpp). Translated like
// the engine's kernel files (tests/simt/gen.py --launchers) and run by the
// host CUDA shim, which must refuse or report each one.
#include "planted.h"

namespace planted {

__global__ void fill_kernel(float* p, int n, float v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}

__global__ void sum_kernel(float* out, const float* x, int n) {
  if (threadIdx.x != 0) return;
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i];
  out[0] = s;
}

// Reads n floats of dynamic shared memory.
__global__ void read_smem_kernel(float* out, int n) {
  extern __shared__ float smem[];
  if (threadIdx.x != 0) return;
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += smem[i] == smem[i] ? 1.0f : 0.0f;
  out[0] = s;
}

// 52 KB of static shared memory (the limit is 48 KB).
__global__ void big_static_smem_kernel(float* out) {
  __shared__ float big[13 * 1024];
  big[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = big[31];
}

// Every block writes out[0]: blocks of one launch are not ordered.
__global__ void every_block_writes_kernel(float* out) {
  if (threadIdx.x == 0) out[0] = static_cast<float>(blockIdx.x);
}

// One 16-byte vector copy from x to out.
__global__ void vector_read_kernel(float* out, const float* x) {
  if (threadIdx.x == 0) *reinterpret_cast<float4*>(out) = *reinterpret_cast<const float4*>(x);
}

void fill(float* p, int n, float v, cudaStream_t s) { fill_kernel<<<1, 64, 0, s>>>(p, n, v); }
void sum(float* out, const float* x, int n, cudaStream_t s) { sum_kernel<<<1, 32, 0, s>>>(out, x, n); }
void fill_with_block(float* p, int n, int threads, cudaStream_t s) { fill_kernel<<<1, threads, 0, s>>>(p, n, 1.0f); }
void read_smem(float* out, int n, size_t smem_bytes, cudaStream_t s) {
  read_smem_kernel<<<1, 32, smem_bytes, s>>>(out, n);
}
void allow_smem(size_t bytes) {
  cudaFuncSetAttribute(read_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}
void big_static_smem(float* out, cudaStream_t s) { big_static_smem_kernel<<<1, 32, 0, s>>>(out); }
void every_block_writes(float* out, int blocks, cudaStream_t s) { every_block_writes_kernel<<<blocks, 32, 0, s>>>(out); }
void vector_read(float* out, const float* x, cudaStream_t s) { vector_read_kernel<<<1, 32, 0, s>>>(out, x); }

}  // namespace planted
