// The parallel layers of parallel/linear.h on the CUDA engine: bf16
// activations, fp32 weight gradients accumulated in place, GEMMs through
// cuBLASLt (kernels/cuda/matmul.h), the group's sums through CudaTpRegion, all
// enqueued on one stream. A column-parallel group is one GEMM against its
// adjacent weights (q/k/v_proj as [QD + 2 KD, C], gate/up_proj as [2F, C]),
// so its input gradient is one GEMM and one sum. Compiled only with -DKVS_CUDA=ON.
#pragma once
#ifdef KVS_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/matmul.h"
#include "parallel/cuda_tp_region.h"

namespace kvs {

class CudaParallelLinear {
 public:
  using bf16 = __nv_bfloat16;
  CudaParallelLinear(cuda::Matmul& mm, CudaTpRegion& region, cudaStream_t stream)
      : mm_(mm), region_(region), stream_(stream) {}

  // Column-parallel: y [N, out] (row stride ldy) = x [N, in] (row stride ldx) W^T, W [out, in].
  void column_forward(bf16* y, int ldy, const bf16* x, int ldx, const bf16* w, int N, int in, int out);
  // dx [N, in] (contiguous, overwritten) = dy W summed over the TP group; dW += dy^T x.
  void column_backward(bf16* dx, float* dw, const bf16* dy, int ldy, const bf16* x, int ldx, const bf16* w, int N,
                       int in, int out);
  // Row-parallel: y [N, out] (contiguous) = sum over the TP group of x [N, in] (row stride ldx) W^T.
  void row_forward(bf16* y, const bf16* x, int ldx, const bf16* w, int N, int in, int out);
  // dx [N, in] (contiguous, overwritten) = dy W; dW += dy^T x. dy is replicated: nothing to communicate.
  void row_backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, int ldx, const bf16* w, int N, int in,
                    int out);

 private:
  cuda::Matmul& mm_;
  CudaTpRegion& region_;
  cudaStream_t stream_;
};

}  // namespace kvs
#endif  // KVS_CUDA
