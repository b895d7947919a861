// The parallel layers of parallel/linear.h on the CUDA engine: bf16
// activations, fp32 weight gradients accumulated in place, GEMMs through
// cuBLASLt (kernels/cuda/matmul.h), the group's sums through CudaTpRegion, all
// enqueued on one stream. A column-parallel group is one GEMM against its
// adjacent weights (q/k/v_proj as [QD + 2 KD, C], gate/up_proj as [2F, C]),
// so its input gradient is one GEMM and one sum.
//
// N is the rows the GEMMs see. Under sequence parallelism (region.sequence_parallel())
// the tensors outside the region (a column group's x and dx, a row-parallel
// layer's y and dy) hold region.local_rows(N) contiguous rows, and `full`,
// `full2` are [N, C] device scratch (C: the one width they ever take, the
// hidden size) for the gathered or not-yet-scattered rows; as on the CPU
// (parallel/linear.cpp) the column group's input is gathered again in the
// backward rather than kept. Compiled only with -DKVS_CUDA=ON.
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
  CudaParallelLinear(cuda::Matmul& mm, CudaTpRegion& region, cudaStream_t stream, bf16* full = nullptr,
                     bf16* full2 = nullptr);

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
  bf16 *full_, *full2_;  // sequence parallelism's [N, C] scratch
};

}  // namespace kvs
#endif  // KVS_CUDA
