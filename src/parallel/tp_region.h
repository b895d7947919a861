// The communication at the edges of a tensor-parallel region (Megatron-LM's
// conjugate operators f and g, Shoeybi et al. 2019, section 3), on host
// buffers for the CPU engine:
//   f  enters column-parallel layers: the input is replicated, so the forward
//      passes it as it is; each rank's input gradient covers only its own
//      columns, so the backward sums it over the group;
//   g  leaves row-parallel layers: each rank's output is a partial sum over
//      its input columns, so the forward sums it over the group; the output
//      gradient is replicated, so the backward passes it as it is.
// With sequence parallelism (Korthikanti et al. 2022) the activations outside
// the region (residual stream, RMSNorm) hold only this rank's N/tp rows of the
// N rows of a micro-batch (rank r: rows [r*N/tp, (r+1)*N/tp)), so f's forward
// and g's backward become all-gathers and f's backward and g's forward
// reduce-scatters; the same bytes move as with the all-reduces. At tp = 1
// nothing is communicated.
//
// Every call takes N, the rows inside the region, and the local buffers; with
// sequence parallelism `full` is an [N, cols] buffer for the gathered or
// not-yet-scattered rows. Without it the local buffers are the full ones.
#pragma once
#include <cstddef>

#include "parallel/tensor_parallel.h"

namespace kvs {

class TensorParallelRegion {
 public:
  explicit TensorParallelRegion(TensorParallel tp = {}, bool sequence_parallel = false);
  const TensorParallel& tp() const { return tp_; }
  bool active() const { return tp_.size > 1; }
  bool sequence_parallel() const { return sp_; }
  // This rank's rows of a region of N rows.
  size_t local_rows(size_t N) const { return sp_ ? N / tp_.size : N; }
  size_t first_row(size_t N) const { return sp_ ? tp_.rank * (N / tp_.size) : 0; }

  // f, forward: the region's input [N, cols] from this rank's rows x
  // (sequence parallel: gathered into `full`; else x itself).
  const float* enter_forward(const float* x, float* full, size_t N, size_t cols) const { return gather(x, full, N, cols); }
  // f, backward: the input gradient dx [N, cols] (partial over the group) summed
  // into this rank's rows dx_local (sequence parallel: reduce-scatter; else an
  // all-reduce in place, dx_local == dx).
  void enter_backward(float* dx, float* dx_local, size_t N, size_t cols) const { reduce(dx, dx_local, N, cols); }
  // g, forward: the partial output y [N, cols] summed into this rank's rows y_local.
  void exit_forward(float* y, float* y_local, size_t N, size_t cols) const { reduce(y, y_local, N, cols); }
  // g, backward: the output gradient [N, cols] from this rank's rows dy.
  const float* exit_backward(const float* dy, float* full, size_t N, size_t cols) const {
    return gather(dy, full, N, cols);
  }

  // Without sequence parallelism, in place on [n] floats (the forms above with N rows of 1).
  void enter_backward(float* dx, size_t n) const { reduce(dx, dx, n, 1); }
  void exit_forward(float* y, size_t n) const { reduce(y, y, n, 1); }

 private:
  const float* gather(const float* local, float* full, size_t N, size_t cols) const;
  void reduce(float* partial, float* local, size_t N, size_t cols) const;
  TensorParallel tp_;
  bool sp_;
};

}  // namespace kvs
