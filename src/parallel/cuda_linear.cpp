#ifdef KVS_CUDA
#include "parallel/cuda_linear.h"

#include <cstddef>

namespace kvs {

void CudaParallelLinear::column_forward(bf16* y, int ldy, const bf16* x, int ldx, const bf16* w, int N, int in,
                                        int out) {
  mm_.forward(y, ldy, x, ldx, w, N, in, out, stream_);
}

void CudaParallelLinear::column_backward(bf16* dx, float* dw, const bf16* dy, int ldy, const bf16* x, int ldx,
                                         const bf16* w, int N, int in, int out) {
  mm_.backward_input(dx, dy, ldy, w, N, in, out, stream_);
  region_.enter_backward(dx, static_cast<size_t>(N) * in);
  mm_.backward_weight(dw, dy, ldy, x, ldx, N, in, out, stream_);
}

void CudaParallelLinear::row_forward(bf16* y, const bf16* x, int ldx, const bf16* w, int N, int in, int out) {
  mm_.forward(y, out, x, ldx, w, N, in, out, stream_);
  region_.exit_forward(y, static_cast<size_t>(N) * out);
}

void CudaParallelLinear::row_backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, int ldx, const bf16* w,
                                      int N, int in, int out) {
  mm_.backward_input(dx, dy, out, w, N, in, out, stream_);
  mm_.backward_weight(dw, dy, out, x, ldx, N, in, out, stream_);
}

}  // namespace kvs
#endif  // KVS_CUDA
