// Multi-tensor AdamW: one launch updates every parameter (see ops.h).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {

namespace {

constexpr int kAdamWThreads = 512;

// Per-step constants, derived on the host exactly as CpuEngine::adamw_step
// derives them (there in double from the hyper-parameters; here in double
// from AdamWArgs' floats, which are those values rounded once).
struct AdamWConsts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float grad_scale;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  float decay;         // 1 - lr * weight_decay, for tensors with kAdamWDecay
};

// One element, in fp32 and in the order CpuEngine::adamw_step writes it:
//   g = grad * scale;  m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g
//   p = p * decay - (step_size * m) / (sqrt(v) * inv_sqrt_bc2 + eps)
//   clamp01: p = clamp(p, 0, 1)
// The explicit _rn intrinsics stop nvcc from fusing multiply-adds, so each
// operation is rounded as written (the CPU formula, operation by operation).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float grad, const AdamWConsts& c,
                                              float decay, bool clamp01) {
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  p = __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(c.step_size, m), denom));
  if (clamp01) p = p < 0.0f ? 0.0f : (1.0f < p ? 1.0f : p);  // std::clamp(p, 0, 1), NaN passes through
}

// Elements [i, end) of the chunk, thread-strided, one at a time.
__device__ __forceinline__ void adamw_scalar(uint64_t i, uint64_t end, float* master, bf16* param_bf16,
                                             const float* grad, float* exp_avg, float* exp_avg_sq,
                                             const AdamWConsts& c, float decay, bool clamp01) {
  for (i += threadIdx.x; i < end; i += blockDim.x) {
    float p = master[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(p, m, v, grad[i], c, decay, clamp01);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    param_bf16[i] = to_bf16(p);
  }
}

// One block per chunk (a range inside one tensor, at most kAdamWChunkElems
// elements), threads striding over it: the chunk's flags are read once per
// block, every access is coalesced, and one launch covers the whole model
// however many tensors it has. The step is a stream of 30 bytes per
// parameter (read master, grad and both moments; write back those but the
// gradient, and the bf16 copy), so with kVec each thread moves four elements
// of the chunk's 4-aligned middle per access (16-byte loads and stores, 8
// bytes for the bf16 copy; the caller checks the pointers' alignment), and
// only the up to 3 + 3 elements at its ends one at a time. Same per-element
// arithmetic, same bits either way. Elements outside every chunk are not touched.
template <bool kVec>
__global__ void __launch_bounds__(kAdamWThreads) adamw_kernel(float* master, bf16* param_bf16, const float* grad,
                                                              float* exp_avg, float* exp_avg_sq,
                                                              const AdamWChunk* chunks, AdamWConsts c) {
  const AdamWChunk chunk = chunks[blockIdx.x];
  const float decay = (chunk.flags & kAdamWDecay) ? c.decay : 1.0f;
  const bool clamp01 = (chunk.flags & kAdamWClamp01) != 0;
  uint64_t mid = chunk.begin, mid_end = chunk.begin;  // [mid, mid_end): the vector part
  if constexpr (kVec) {
    mid = min((chunk.begin + 3) & ~uint64_t{3}, chunk.end);
    mid_end = max(mid, chunk.end & ~uint64_t{3});
    for (uint64_t i = mid + 4 * threadIdx.x; i < mid_end; i += 4 * blockDim.x) {
      float4 p = *reinterpret_cast<const float4*>(master + i);
      float4 m = *reinterpret_cast<const float4*>(exp_avg + i);
      float4 v = *reinterpret_cast<const float4*>(exp_avg_sq + i);
      const float4 g = *reinterpret_cast<const float4*>(grad + i);
      adamw_element(p.x, m.x, v.x, g.x, c, decay, clamp01);
      adamw_element(p.y, m.y, v.y, g.y, c, decay, clamp01);
      adamw_element(p.z, m.z, v.z, g.z, c, decay, clamp01);
      adamw_element(p.w, m.w, v.w, g.w, c, decay, clamp01);
      *reinterpret_cast<float4*>(exp_avg + i) = m;
      *reinterpret_cast<float4*>(exp_avg_sq + i) = v;
      *reinterpret_cast<float4*>(master + i) = p;
      __align__(8) bf16 b[4] = {to_bf16(p.x), to_bf16(p.y), to_bf16(p.z), to_bf16(p.w)};
      *reinterpret_cast<uint2*>(param_bf16 + i) = *reinterpret_cast<const uint2*>(b);
    }
  }
  adamw_scalar(chunk.begin, mid, master, param_bf16, grad, exp_avg, exp_avg_sq, c, decay, clamp01);
  adamw_scalar(mid_end, chunk.end, master, param_bf16, grad, exp_avg, exp_avg_sq, c, decay, clamp01);
}

}  // namespace

void adamw_step(float* master, bf16* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq,
                const AdamWChunk* chunks, int num_chunks, const AdamWArgs& a, cudaStream_t stream) {
  if (num_chunks <= 0) return;
  AdamWConsts c;
  c.beta1 = a.beta1;
  c.one_minus_beta1 = 1.0f - a.beta1;
  c.beta2 = a.beta2;
  c.one_minus_beta2 = 1.0f - a.beta2;
  c.eps = a.eps;
  c.grad_scale = a.grad_scale;
  c.step_size = static_cast<float>(static_cast<double>(a.lr) / static_cast<double>(a.bias_correction1));
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.bias_correction2)));
  c.decay = 1.0f - a.lr * a.weight_decay;  // float arithmetic, as on the CPU
  const bool vec = aligned16(master) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                   reinterpret_cast<uintptr_t>(param_bf16) % 8 == 0;
  if (vec) {
    adamw_kernel<true><<<num_chunks, kAdamWThreads, 0, stream>>>(master, param_bf16, grad, exp_avg, exp_avg_sq,
                                                                 chunks, c);
  } else {
    adamw_kernel<false><<<num_chunks, kAdamWThreads, 0, stream>>>(master, param_bf16, grad, exp_avg, exp_avg_sq,
                                                                  chunks, c);
  }
  KVS_CUDA_LAUNCH_CHECK("adamw_kernel", stream);
}

}  // namespace kvs::cuda
