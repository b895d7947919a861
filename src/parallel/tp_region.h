// The communication at the edges of a tensor-parallel region (Megatron-LM's
// conjugate operators f and g, Shoeybi et al. 2019, section 3), on host
// buffers for the CPU engine:
//   f  enters column-parallel layers: the input is replicated, so the forward
//      passes it as it is; each rank's input gradient covers only its own
//      columns, so the backward sums it over the group;
//   g  leaves row-parallel layers: each rank's output is a partial sum over
//      its input columns, so the forward sums it over the group; the output
//      gradient is replicated, so the backward passes it as it is.
// At tp = 1 both are no-ops. (Sequence parallelism replaces the two sums by an
// all-gather/reduce-scatter pair; that is why they live here and nowhere else.)
#pragma once
#include <cstddef>

#include "parallel/tensor_parallel.h"

namespace kvs {

class TensorParallelRegion {
 public:
  explicit TensorParallelRegion(TensorParallel tp = {}) : tp_(tp) {}
  const TensorParallel& tp() const { return tp_; }
  bool active() const { return tp_.size > 1; }

  // f, backward: dx[0..n) summed over the group, in place.
  void enter_backward(float* dx, size_t n) const { sum(dx, n); }
  // g, forward: y[0..n) summed over the group, in place.
  void exit_forward(float* y, size_t n) const { sum(y, n); }

 private:
  void sum(float* buf, size_t n) const;
  TensorParallel tp_;
};

}  // namespace kvs
