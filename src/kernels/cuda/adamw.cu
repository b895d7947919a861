// Multi-tensor AdamW: one launch updates every parameter (see ops.h).
#include <cmath>

#include "kernels/cuda/common.cuh"
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

// One block per chunk (a range inside one tensor, at most kAdamWChunkElems
// elements), threads striding over it: the chunk's flags are read once per
// block, every access is coalesced, and one launch covers the whole model
// however many tensors it has. Per element, in fp32 and in the order
// CpuEngine::adamw_step writes it:
//   g = grad * scale;  m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g
//   p = p * decay - (step_size * m) / (sqrt(v) * inv_sqrt_bc2 + eps)
//   clamp01: p = clamp(p, 0, 1);  param_bf16 = bf16(p)
// The explicit _rn intrinsics stop nvcc from fusing multiply-adds, so each
// operation is rounded as written (the CPU formula, operation by operation).
// Elements outside every chunk are not touched.
__global__ void __launch_bounds__(kAdamWThreads) adamw_kernel(float* master, bf16* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq,
                             const AdamWChunk* chunks, AdamWConsts c) {
  const AdamWChunk chunk = chunks[blockIdx.x];
  const float decay = (chunk.flags & kAdamWDecay) ? c.decay : 1.0f;
  const bool clamp01 = (chunk.flags & kAdamWClamp01) != 0;
  for (uint64_t i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
    const float g = __fmul_rn(grad[i], c.grad_scale);
    const float m = __fadd_rn(__fmul_rn(c.beta1, exp_avg[i]), __fmul_rn(c.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(c.beta2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps);
    float p = __fsub_rn(__fmul_rn(master[i], decay), __fdiv_rn(__fmul_rn(c.step_size, m), denom));
    if (clamp01) p = p < 0.0f ? 0.0f : (1.0f < p ? 1.0f : p);  // std::clamp(p, 0, 1), NaN passes through
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    param_bf16[i] = to_bf16(p);
  }
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
  adamw_kernel<<<num_chunks, kAdamWThreads, 0, stream>>>(master, param_bf16, grad, exp_avg, exp_avg_sq, chunks, c);
  KVS_CUDA_LAUNCH_CHECK("adamw_kernel", stream);
}

}  // namespace kvs::cuda
