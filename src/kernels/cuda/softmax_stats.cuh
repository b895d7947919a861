// Online softmax statistics of a row of logits, shared by the fused loss
// (cross_entropy.cu) and the vocab-parallel loss (vocab_parallel_ce.cu): the
// maximum m, the sum s = sum exp(x - m), and the first index of the maximum.
// Included by .cu files only.
#pragma once
#include <climits>

#include "kernels/cuda/common.cuh"

namespace kvs::cuda {

// Empty: m = -inf, s = 0, idx = INT_MAX.
struct RowStats {
  float m, s;
  int idx;
};

// Merges two sets. Symmetric (the result does not depend on the argument
// order), so every lane of a butterfly reduction ends with the same bits.
__device__ __forceinline__ RowStats merge(RowStats a, RowStats b) {
  const bool take_b = b.m > a.m || (b.m == a.m && b.idx < a.idx);
  RowStats r;
  r.m = take_b ? b.m : a.m;
  r.idx = take_b ? b.idx : a.idx;
  const float sa = a.s == 0.0f ? 0.0f : a.s * expf(a.m - r.m);
  const float sb = b.s == 0.0f ? 0.0f : b.s * expf(b.m - r.m);
  r.s = sa + sb;
  return r;
}

// Adds one logit x at index i to a thread's running statistics; a thread sees
// its indices in increasing order, so the strict > keeps the first maximum.
__device__ __forceinline__ void push(RowStats& st, float x, int i) {
  if (x > st.m) {
    st.s = st.s * expf(st.m - x) + 1.0f;
    st.m = x;
    st.idx = i;
  } else {
    st.s += expf(x - st.m);
  }
}

// Every thread gets the block's statistics (blockDim.x a multiple of 32):
// butterfly within each warp, then each thread merges the per-warp results in
// warp order (fixed, so deterministic). Contains a __syncthreads.
__device__ __forceinline__ RowStats block_merge(RowStats st) {
  __shared__ float sm_m[32], sm_s[32];
  __shared__ int sm_idx[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    RowStats other;
    other.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    other.idx = __shfl_xor_sync(0xffffffffu, st.idx, o);
    st = merge(st, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (lane == 0) {
    sm_m[warp] = st.m;
    sm_s[warp] = st.s;
    sm_idx[warp] = st.idx;
  }
  __syncthreads();
  RowStats r{sm_m[0], sm_s[0], sm_idx[0]};
  for (int w = 1; w < nwarps; ++w) r = merge(r, RowStats{sm_m[w], sm_s[w], sm_idx[w]});
  return r;
}

}  // namespace kvs::cuda
