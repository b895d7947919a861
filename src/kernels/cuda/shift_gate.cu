// The sigmoid gate of section 4.6 on the device: a handful of scalars per
// layer, one thread per head. It exists so that the shift coefficients never
// leave the GPU (the CPU op with the same arithmetic: kernels/cpu/shift_gate.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace kvs::cuda {
namespace {

__global__ void shift_gate_forward_kernel(float* eff, const float* stored, int H) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  const float s = 1.0f / (1.0f + expf(-stored[h * 2 + 1]));
  eff[h * 2 + 0] = 1.0f - s;
  eff[h * 2 + 1] = s;
}

__global__ void shift_gate_backward_kernel(float* dstored, const float* deff, const float* stored, int H) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  const float s = 1.0f / (1.0f + expf(-stored[h * 2 + 1]));
  dstored[h * 2 + 1] += s * (1.0f - s) * (deff[h * 2 + 1] - deff[h * 2 + 0]);
}

}  // namespace

void shift_gate_forward(float* eff, const float* stored, int H, cudaStream_t stream) {
  if (H <= 0) return;  // a zero-block grid is a launch error
  shift_gate_forward_kernel<<<ceil_div(H, 128), 128, 0, stream>>>(eff, stored, H);
  KVS_CUDA_LAUNCH_CHECK("shift_gate_forward", stream);
}

void shift_gate_backward(float* dstored, const float* deff, const float* stored, int H, cudaStream_t stream) {
  if (H <= 0) return;
  shift_gate_backward_kernel<<<ceil_div(H, 128), 128, 0, stream>>>(dstored, deff, stored, H);
  KVS_CUDA_LAUNCH_CHECK("shift_gate_backward", stream);
}

}  // namespace kvs::cuda
