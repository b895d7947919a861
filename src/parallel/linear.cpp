#include "parallel/linear.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace kvs {

void column_parallel_forward(const float* x, int N, int in, std::initializer_list<ColumnOut> outs,
                             const TensorParallelRegion& region, float* full) {
  const float* xs = region.enter_forward(x, full, N, in);
  for (const ColumnOut& o : outs) cpu::matmul_forward(o.y, xs, o.w, N, in, o.out);
}

void column_parallel_backward(float* dx, const float* x, int N, int in, std::initializer_list<ColumnGrad> grads,
                              const TensorParallelRegion& region, float* full, float* full2) {
  // Sequence parallel: the input is gathered again (not kept gathered from the
  // forward, which is what saves the memory) and the input gradient is
  // computed for all N rows before its reduce-scatter.
  const float* xs = region.enter_forward(x, full, N, in);
  float* dxs = region.sequence_parallel() ? full2 : dx;
  // The first layer's product overwrites dxs (no pass to zero it first), the others add.
  bool first = true;
  for (const ColumnGrad& g : grads) {
    cpu::matmul_backward(dxs, g.dw, g.dy, xs, g.w, N, in, g.out, /*overwrite_dinp=*/first);
    first = false;
  }
  if (first) std::memset(dxs, 0, static_cast<size_t>(N) * in * sizeof(float));
  region.enter_backward(dxs, dx, N, in);
}

void row_parallel_forward(float* y, const float* x, const float* w, int N, int in, int out,
                          const TensorParallelRegion& region, float* full) {
  float* ys = region.sequence_parallel() ? full : y;
  cpu::matmul_forward(ys, x, w, N, in, out);
  region.exit_forward(ys, y, N, out);
}

void row_parallel_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                           int out, const TensorParallelRegion& region, float* full, bool overwrite_dx) {
  cpu::matmul_backward(dx, dw, region.exit_backward(dy, full, N, out), x, w, N, in, out, overwrite_dx);
}

void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v_begin,
                                      int v_count, const TensorParallelRegion& region, float* full) {
  float* outs = region.sequence_parallel() ? full : out;
  cpu::embedding_forward(outs, tokens, wte, N, C, v_begin, v_count);
  region.exit_forward(outs, out, N, C);
}

void vocab_parallel_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                                       int v_begin, int v_count, const TensorParallelRegion& region, float* full) {
  cpu::embedding_backward(dwte, region.exit_backward(dout, full, N, C), tokens, N, C, v_begin, v_count);
}

}  // namespace kvs
