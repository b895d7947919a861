// Deterministic fp64 sums of fp32 buffers: sum_f32 (the loss total) and
// sum_squares_f32 (the gradient norm). See ops.h for the contract.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {

namespace {

// The launch shape depends on n only, never on the device, so the summation
// order (and the result's bits) is the same on every run and every GPU: blocks
// of 256 threads, enough that each thread reads about kSumPerThread elements,
// at most 1024 blocks (x 256 threads: about one full wave on an H100, 132 SMs
// x 2048). A small n (a loss total, a small model's gradient) takes a few
// blocks, not a wave of idle ones (under the host build's emulator the 1024
// blocks were 70% of a tiny model's training time).
constexpr int kSumBlocks = 1024;
constexpr int kSumThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr size_t kSumPerThread = 16;

int sum_blocks(size_t n) {
  const size_t per_block = size_t(kSumThreads) * kSumPerThread;
  return static_cast<int>(std::clamp<size_t>((n + per_block - 1) / per_block, 1, kSumBlocks));
}

template <bool kSquare>
__device__ __forceinline__ double term(float x) {
  const double d = x;
  return kSquare ? d * d : d;
}

// Pass 1: block b sums x[i] (or x[i]^2) in fp64 for i = b*blockDim + t +
// j*stride over a grid-stride loop, then over the block, and writes
// partials[b]. The loop body is unrolled by hand four strides at a time so
// that four independent loads are in flight per thread (the kernel is
// bandwidth-bound); the additions still happen in plain loop order, so the
// unrolling does not change the result.
template <bool kSquare>
__global__ void __launch_bounds__(kSumThreads) sum_partials_kernel(double* partials, const float* x, size_t n) {
  __shared__ double smem[32];
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  double acc = 0.0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const float a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    acc += term<kSquare>(a);
    acc += term<kSquare>(b);
    acc += term<kSquare>(c);
    acc += term<kSquare>(d);
  }
  for (; i < n; i += stride) acc += term<kSquare>(x[i]);
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2: one block adds the per-block partials in a fixed order.
__global__ void __launch_bounds__(kFinalThreads) sum_final_kernel(double* out, const double* partials, int count) {
  __shared__ double smem[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) *out = acc;
}

template <bool kSquare>
void launch_sum(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream) {
  const int blocks = sum_blocks(n);
  sum_partials_kernel<kSquare><<<blocks, kSumThreads, 0, stream>>>(scratch, x, n);
  KVS_CUDA_LAUNCH_CHECK("sum_partials_kernel", stream);
  sum_final_kernel<<<1, kFinalThreads, 0, stream>>>(out, scratch, blocks);
  KVS_CUDA_LAUNCH_CHECK("sum_final_kernel", stream);
}

}  // namespace

size_t sum_scratch_doubles(size_t /*n*/) { return kSumBlocks; }

void sum_f32(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream) {
  launch_sum<false>(out, x, n, scratch, stream);
}

void sum_squares_f32(double* out, const float* g, size_t n, double* scratch, cudaStream_t stream) {
  launch_sum<true>(out, g, n, scratch, stream);
}

}  // namespace kvs::cuda
