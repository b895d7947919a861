#include "parallel/linear.h"

#include <cstring>

#include "kernels/cpu/ops.h"

namespace kvs {

void column_parallel_forward(const float* x, int N, int in, std::initializer_list<ColumnOut> outs) {
  for (const ColumnOut& o : outs) cpu::matmul_forward(o.y, x, o.w, N, in, o.out);
}

void column_parallel_backward(float* dx, const float* x, int N, int in, std::initializer_list<ColumnGrad> grads,
                              const TensorParallelRegion& region) {
  const size_t n = static_cast<size_t>(N) * in;
  std::memset(dx, 0, n * sizeof(float));
  for (const ColumnGrad& g : grads) cpu::matmul_backward(dx, g.dw, g.dy, x, g.w, N, in, g.out);
  region.enter_backward(dx, n);
}

void row_parallel_forward(float* y, const float* x, const float* w, int N, int in, int out,
                          const TensorParallelRegion& region) {
  cpu::matmul_forward(y, x, w, N, in, out);
  region.exit_forward(y, static_cast<size_t>(N) * out);
}

void row_parallel_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                           int out) {
  cpu::matmul_backward(dx, dw, dy, x, w, N, in, out);
}

void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v_begin,
                                      int v_count, const TensorParallelRegion& region) {
  cpu::embedding_forward(out, tokens, wte, N, C, v_begin, v_count);
  region.exit_forward(out, static_cast<size_t>(N) * C);
}

void vocab_parallel_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                                       int v_begin, int v_count) {
  cpu::embedding_backward(dwte, dout, tokens, N, C, v_begin, v_count);
}

}  // namespace kvs
