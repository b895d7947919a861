// Token embedding: the forward gathers rows of wte; the backward scatters
// dout's rows back into dwte without atomics, from a host-built grouping of
// the positions by token (embedding_backward_plan).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {


// V consecutive bf16 as fp32 (V == 8: one 16-byte load; p 16-byte aligned).

// Forward: a flat copy. Thread i moves chunk i of V elements (V = 8: one
// 16-byte load and store, when C % 8 == 0 and both pointers are aligned;
// otherwise V = 1), chunks numbered row-major over [N, C / V], so a warp reads
// and writes contiguous spans of a row. Grid-stride over the N * C / V chunks.
// Tokens are not range-checked here (the data loader guarantees [0, V)).
// Under tensor parallelism wte holds the vocabulary rows [v_begin, v_begin +
// v_rows) only; a token outside them gets a zero row (another rank's row is
// added by the all-reduce that follows).
template <int V>
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, int v_begin,
                                         int v_rows) {
  const int chunks_per_row = C / V;
  const size_t total = (size_t)N * chunks_per_row;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t n = i / chunks_per_row;
    const int c = (int)(i % chunks_per_row) * V;
    const int row = tokens[n] - v_begin;
    bf16* dst = out + n * C + c;
    if (row < 0 || row >= v_rows) {
      if constexpr (V == 8) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);  // bf16 +0 is all-zero bits
      } else {
        *dst = __float2bfloat16_rn(0.0f);
      }
      continue;
    }
    const bf16* src = wte + (size_t)row * C + c;
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
  }
}

// Backward: block u owns the distinct token uniq[u], hence the row dwte[uniq[u]]
// that no other block touches (no atomics). Its threads split the C columns
// (V consecutive columns per thread per step, 16-byte loads for V = 8); each
// thread walks the token's positions in the given (ascending) order, sums
// dout in fp32 registers, and adds the sum into dwte once. The order of every
// sum is fixed by the plan, so the result is bitwise reproducible. The
// position loop is unrolled so several independent row loads are in flight
// while the adds stay in order. A very frequent token makes one long block
// (its rows are summed serially); the plan lists tokens by id, not by count.
template <int V>
__global__ void embedding_backward_kernel(float* dwte, const bf16* dout, const int32_t* uniq, const int32_t* offsets,
                                          const int32_t* positions, int C) {
  const int u = blockIdx.x;
  const int p0 = offsets[u], p1 = offsets[u + 1];
  float* dst_row = dwte + (size_t)uniq[u] * C;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float acc[V] = {};
#pragma unroll 4
    for (int p = p0; p < p1; ++p) {
      float v[V];
      load_bf16<V>(v, dout + (size_t)positions[p] * C + c);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += v[k];
    }
    float* dst = dst_row + c;
    if constexpr (V == 8) {
      float4 a = reinterpret_cast<float4*>(dst)[0], b = reinterpret_cast<float4*>(dst)[1];
      a.x += acc[0], a.y += acc[1], a.z += acc[2], a.w += acc[3];
      b.x += acc[4], b.y += acc[5], b.z += acc[6], b.w += acc[7];
      reinterpret_cast<float4*>(dst)[0] = a;
      reinterpret_cast<float4*>(dst)[1] = b;
    } else {
      dst[0] += acc[0];
    }
  }
}

// Threads per block for a row of `chunks` units of work: a multiple of 32, at
// most 256 (rows wider than that loop).
int row_threads(int chunks) {
  const int t = (chunks + 31) / 32 * 32;
  return t < 32 ? 32 : (t > 256 ? 256 : t);
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, cudaStream_t stream) {
  embedding_forward_vocab_slice(out, tokens, wte, N, C, 0, INT_MAX, stream);
}

void embedding_forward_vocab_slice(bf16* out, const int32_t* tokens, const bf16* wte, int N, int C, int v_begin,
                                   int v_rows, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  constexpr int kThreads = 256;
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(wte);
  const size_t chunks = (size_t)N * (vec ? C / 8 : C);
  const unsigned blocks = (unsigned)std::min<size_t>((chunks + kThreads - 1) / kThreads, 1u << 16);
  if (vec) {
    embedding_forward_kernel<8><<<blocks, kThreads, 0, stream>>>(out, tokens, wte, N, C, v_begin, v_rows);
  } else {
    embedding_forward_kernel<1><<<blocks, kThreads, 0, stream>>>(out, tokens, wte, N, C, v_begin, v_rows);
  }
  KVS_CUDA_LAUNCH_CHECK("embedding_forward_kernel", stream);
}

void embedding_backward(float* dwte, const bf16* dout, const int32_t* uniq, const int32_t* offsets,
                        const int32_t* positions, int U, int C, cudaStream_t stream) {
  if (U <= 0 || C <= 0) return;
  const bool vec = C % 8 == 0 && aligned16(dwte) && aligned16(dout);
  if (vec) {
    embedding_backward_kernel<8><<<U, row_threads(C / 8), 0, stream>>>(dwte, dout, uniq, offsets, positions, C);
  } else {
    embedding_backward_kernel<1><<<U, row_threads(C), 0, stream>>>(dwte, dout, uniq, offsets, positions, C);
  }
  KVS_CUDA_LAUNCH_CHECK("embedding_backward_kernel", stream);
}

// Counting sort by token id: count each token, give each distinct token (in
// ascending id order) a contiguous range of `positions` by a prefix sum, then
// drop the positions in with one pass in ascending n (so every range is
// ascending). O(N + V') time and O(V') host memory, V' = 1 + the largest token.
int embedding_backward_plan(const int32_t* tokens, int N, int32_t* uniq, int32_t* offsets, int32_t* positions) {
  if (N <= 0) {
    if (offsets) offsets[0] = 0;
    return 0;
  }
  int32_t max_token = 0;
  for (int n = 0; n < N; ++n) {
    KVS_CHECK(tokens[n] >= 0, "embedding_backward_plan: negative token {} at position {}", tokens[n], n);
    max_token = std::max(max_token, tokens[n]);
  }
  std::vector<int32_t> next((size_t)max_token + 1, 0);  // counts, then each token's write cursor
  for (int n = 0; n < N; ++n) ++next[tokens[n]];
  int U = 0, start = 0;
  for (int32_t v = 0; v <= max_token; ++v) {
    const int32_t count = next[v];
    if (count == 0) continue;
    uniq[U] = v;
    offsets[U] = start;
    next[v] = start;
    start += count;
    ++U;
  }
  offsets[U] = N;
  for (int n = 0; n < N; ++n) positions[next[tokens[n]]++] = n;
  return U;
}

}  // namespace kvs::cuda
