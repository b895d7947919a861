#include "parallel/tp_region.h"

#include "dist/comm.h"

namespace kvs {

void TensorParallelRegion::sum(float* buf, size_t n) const {
  if (tp_.size > 1) tp_.comm->all_reduce(buf, n, dist::DType::F32, dist::ReduceOp::Sum);
}

}  // namespace kvs
