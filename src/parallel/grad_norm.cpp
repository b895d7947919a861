#include "parallel/grad_norm.h"

#include <algorithm>
#include <cmath>

#include "dist/comm.h"

namespace kvs {

namespace {
const char* const kEmbedding = "model.embed_tokens.weight";
}

double local_grad_sq_sum(Engine& e, size_t begin, size_t end, const TensorParallel& tp, bool tied_copy) {
  if (tp.size == 1 && !tied_copy) return e.grad_sq_sum_range(begin, end);
  // One engine call per run of adjacent counted tensors, not per tensor: on
  // the CUDA engine each call is a reduction launch and a host synchronisation.
  double sq = 0;
  size_t run_lo = 0, run_hi = 0;
  auto flush = [&] {
    if (run_lo < run_hi) sq += e.grad_sq_sum_range(run_lo, run_hi);
    run_lo = run_hi = 0;
  };
  for (const ParamTensor& t : e.layout().tensors) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if ((t.split_dim < 0 && tp.rank != 0) || (tied_copy && t.name == kEmbedding) || lo >= hi) {
      flush();
      continue;
    }
    if (run_lo < run_hi && run_hi == lo) {
      run_hi = hi;
    } else {
      flush();
      run_lo = lo;
      run_hi = hi;
    }
  }
  flush();
  return sq;
}

double global_grad_norm(Engine& e, const TensorParallel& tp, const PipelineNorm& pipe) {
  const bool pipeline = pipe.comm && pipe.comm->size() > 1;
  if (tp.size == 1 && !pipeline) return e.grad_norm();
  double sq = local_grad_sq_sum(e, 0, e.layout().total, tp, pipe.tied_copy);
  if (tp.size > 1) tp.comm->all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  if (pipeline) pipe.comm->all_reduce(&sq, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return std::sqrt(sq);
}

}  // namespace kvs
