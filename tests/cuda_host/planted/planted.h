// Launchers of planted.cu: each launches one kernel on stream s (errors are
// left to cudaGetLastError and the next synchronisation).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace planted {

void fill(float* p, int n, float v, cudaStream_t s);          // p[0, n) = v
void sum(float* out, const float* x, int n, cudaStream_t s);  // out[0] = sum of x[0, n)
void fill_with_block(float* p, int n, int threads, cudaStream_t s);
void read_smem(float* out, int n, size_t smem_bytes, cudaStream_t s);  // reads n floats of dynamic shared memory
void allow_smem(size_t bytes);  // read_smem's dynamic shared memory opt-in
void big_static_smem(float* out, cudaStream_t s);
void every_block_writes(float* out, int blocks, cudaStream_t s);  // out[0] = blockIdx.x in every block
void vector_read(float* out, const float* x, cudaStream_t s);     // out[0, 4) = one float4 at x

}  // namespace planted
