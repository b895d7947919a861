// Megatron-style parallel layers on the CPU engine's fp32 host buffers
// (docs/PARALLEL.md). Weights are this rank's slice (parallel/tensor_parallel.h);
// at tp = 1 they are the whole tensors and nothing is communicated.
//
// Column-parallel: W [out, in] split by output rows. Every rank reads the same
// replicated input x [N, in] and computes its columns of y. Layers that read
// one input form one group (q/k/v_proj; gate/up_proj; the LM head), so the
// input gradient is summed over the TP group once per group, not per layer.
//
// Row-parallel: W [out, in] split by input columns. Each rank multiplies its
// columns of x (the output of a column-parallel group) and the partial
// products are summed over the group (o_proj; down_proj).
//
// Vocab-parallel embedding: each rank holds the rows of its vocabulary range
// and writes zero rows for the other tokens; the sum over the group is the
// lookup.
//
// N is the number of rows the GEMMs see. The activations outside the region
// (a column group's input x and its gradient dx, a row-parallel layer's output
// y and its gradient dy, the embedding's output) have region.local_rows(N)
// rows: N, or N/tp under sequence parallelism, where `full` (and `full2`) are
// [N, C] scratch buffers for the gathered or not-yet-scattered rows
// (tp_region.h). Every backward follows kernels/cpu: parameter gradients are
// accumulated (+=).
#pragma once
#include <cstdint>
#include <initializer_list>

#include "parallel/tp_region.h"

namespace kvs {

// One layer of a column-parallel group: y [N, out] = x W^T with W [out, in].
struct ColumnOut {
  float* y;
  const float* w;
  int out;
};
// Its backward: dW += dy^T x, and dy W added into the group's input gradient.
struct ColumnGrad {
  const float* dy;
  const float* w;
  float* dw;
  int out;
};

void column_parallel_forward(const float* x, int N, int in, std::initializer_list<ColumnOut> outs,
                             const TensorParallelRegion& region, float* full = nullptr);
// dx is overwritten with the sum over the group's layers and over the TP group.
void column_parallel_backward(float* dx, const float* x, int N, int in, std::initializer_list<ColumnGrad> grads,
                              const TensorParallelRegion& region, float* full = nullptr, float* full2 = nullptr);

// y = sum over the TP group of x [N, in] W^T, W [out, in] (overwrites y).
void row_parallel_forward(float* y, const float* x, const float* w, int N, int in, int out,
                          const TensorParallelRegion& region, float* full = nullptr);
// dx [N, in] += dy W (overwrite_dx: dx = dy W) ; dW += dy^T x. dy is replicated: nothing is summed.
void row_parallel_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                           int out, const TensorParallelRegion& region, float* full = nullptr,
                           bool overwrite_dx = false);

// out = wte[tokens] for N tokens, where wte holds vocabulary rows [v_begin, v_begin + v_count).
void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int v_begin,
                                      int v_count, const TensorParallelRegion& region, float* full = nullptr);
// dwte[token - v_begin] += dout for this rank's tokens.
void vocab_parallel_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C,
                                       int v_begin, int v_count, const TensorParallelRegion& region,
                                       float* full = nullptr);

}  // namespace kvs
