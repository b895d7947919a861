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
  double sq = 0;
  for (const ParamTensor& t : e.layout().tensors) {
    if (t.split_dim < 0 && tp.rank != 0) continue;
    if (tied_copy && t.name == kEmbedding) continue;
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo < hi) sq += e.grad_sq_sum_range(lo, hi);
  }
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
