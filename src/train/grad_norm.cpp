#include "train/grad_norm.h"

#include <algorithm>

namespace kvs {

double local_grad_sq_sum(Engine& e, size_t begin, size_t end, const TensorParallel& tp) {
  if (tp.size == 1) return e.grad_sq_sum_range(begin, end);
  double sq = 0;
  for (const ParamTensor& t : e.layout().tensors) {
    if (t.split_dim < 0 && tp.rank != 0) continue;
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo < hi) sq += e.grad_sq_sum_range(lo, hi);
  }
  return sq;
}

}  // namespace kvs
