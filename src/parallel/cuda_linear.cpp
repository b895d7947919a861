#ifdef KVS_CUDA
#include "parallel/cuda_linear.h"

#include <cstddef>

#include "core/error.h"

namespace kvs {

namespace {

// The local rows' element count of an [N, cols] region tensor.
size_t local_elems(const CudaTpRegion& region, int N, int cols) { return region.local_rows(N) * static_cast<size_t>(cols); }

}  // namespace

CudaParallelLinear::CudaParallelLinear(cuda::Matmul& mm, CudaTpRegion& region, cudaStream_t stream, bf16* full,
                                       bf16* full2)
    : mm_(mm), region_(region), stream_(stream), full_(full), full2_(full2) {
  KVS_CHECK(!region.sequence_parallel() || (full && full2), "sequence parallelism needs two [N, C] scratch buffers");
}

void CudaParallelLinear::column_forward(bf16* y, int ldy, const bf16* x, int ldx, const bf16* w, int N, int in,
                                        int out) {
  if (region_.sequence_parallel()) {
    KVS_CHECK(ldx == in, "sequence parallelism: a column-parallel input must be contiguous");
    region_.gather_bf16(x, full_, local_elems(region_, N, in));
    x = full_;
  }
  mm_.forward(y, ldy, x, ldx, w, N, in, out, stream_);
}

void CudaParallelLinear::column_backward(bf16* dx, float* dw, const bf16* dy, int ldy, const bf16* x, int ldx,
                                         const bf16* w, int N, int in, int out) {
  if (!region_.sequence_parallel()) {
    mm_.backward_input(dx, dy, ldy, w, N, in, out, stream_);
    region_.enter_backward(dx, static_cast<size_t>(N) * in);
    mm_.backward_weight(dw, dy, ldy, x, ldx, N, in, out, stream_);
    return;
  }
  KVS_CHECK(ldx == in, "sequence parallelism: a column-parallel input must be contiguous");
  const size_t n = local_elems(region_, N, in);
  mm_.backward_input(full2_, dy, ldy, w, N, in, out, stream_);
  region_.scatter_sum_bf16(full2_, dx, n);
  region_.gather_bf16(x, full_, n);
  mm_.backward_weight(dw, dy, ldy, full_, in, N, in, out, stream_);
}

void CudaParallelLinear::row_forward(bf16* y, const bf16* x, int ldx, const bf16* w, int N, int in, int out) {
  if (!region_.sequence_parallel()) {
    mm_.forward(y, out, x, ldx, w, N, in, out, stream_);
    region_.exit_forward(y, static_cast<size_t>(N) * out);
    return;
  }
  mm_.forward(full_, out, x, ldx, w, N, in, out, stream_);
  region_.scatter_sum_bf16(full_, y, local_elems(region_, N, out));
}

void CudaParallelLinear::row_backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, int ldx, const bf16* w,
                                      int N, int in, int out) {
  if (region_.sequence_parallel()) {
    region_.gather_bf16(dy, full_, local_elems(region_, N, out));
    dy = full_;
  }
  mm_.backward_input(dx, dy, out, w, N, in, out, stream_);
  mm_.backward_weight(dw, dy, out, x, ldx, N, in, out, stream_);
}

}  // namespace kvs
#endif  // KVS_CUDA
