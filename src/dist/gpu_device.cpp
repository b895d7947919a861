// Which GPU this process uses (nccl_comm.h): needed with or without NCCL.
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "core/error.h"
#include "dist/nccl_comm.h"
#include "kernels/cuda/check.h"

namespace kvs::dist {

int select_device(const LaunchInfo& info) {
  constexpr cuda::ErrorCheck check_cuda{"GPU selection"};
  int n = 0;
  check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  KVS_CHECK(n > 0, "rank {}: no CUDA device visible", info.rank);
  const int dev = info.local_rank % n;
  check_cuda(cudaSetDevice(dev), "cudaSetDevice");
  return dev;
}

}  // namespace kvs::dist
#endif  // KVS_CUDA
