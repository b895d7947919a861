#include "parallel/tp_region.h"

#include <cstring>

#include "core/error.h"
#include "dist/comm.h"

namespace kvs {

TensorParallelRegion::TensorParallelRegion(TensorParallel tp, bool sequence_parallel)
    : tp_(tp), sp_(sequence_parallel && tp.size > 1) {}

const float* TensorParallelRegion::gather(const float* local, float* full, size_t N, size_t cols) const {
  if (!sp_) return local;
  KVS_CHECK(N % tp_.size == 0, "sequence parallelism: {} rows do not split over {} ranks", N, tp_.size);
  tp_.comm->all_gather(local, full, N / tp_.size * cols, dist::DType::F32);
  return full;
}

void TensorParallelRegion::reduce(float* partial, float* local, size_t N, size_t cols) const {
  if (tp_.size == 1) {
    if (local != partial) std::memcpy(local, partial, N * cols * sizeof(float));
    return;
  }
  if (!sp_) {
    tp_.comm->all_reduce(partial, N * cols, dist::DType::F32, dist::ReduceOp::Sum);
    if (local != partial) std::memcpy(local, partial, N * cols * sizeof(float));
    return;
  }
  KVS_CHECK(N % tp_.size == 0, "sequence parallelism: {} rows do not split over {} ranks", N, tp_.size);
  tp_.comm->reduce_scatter(partial, local, N / tp_.size * cols, dist::DType::F32, dist::ReduceOp::Sum);
}

}  // namespace kvs
