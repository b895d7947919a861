#ifdef KVS_CUDA
#include "parallel/cuda_cp_exchange.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "dist/comm.h"
#include "kernels/cuda/check.h"

namespace kvs {

namespace {
constexpr cuda::ErrorCheck check{"context-parallel exchange"};
}

CudaCpExchange::CudaCpExchange(const ContextParallel& cp, cudaStream_t stream, size_t max_bytes)
    : cp_(cp), stream_(stream), max_bytes_(max_bytes) {
  KVS_CHECK(cp.size > 1 && cp.comm && cp.comm->size() == cp.size && cp.comm->rank() == cp.rank,
            "context parallelism: rank {} of {} needs a communicator of that size and rank", cp.rank, cp.size);
  device_ = cp.comm->device_memory();
  if (!device_) check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), 2 * max_bytes_), "cudaMallocHost");
}

CudaCpExchange::~CudaCpExchange() {
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaCpExchange::drain() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

void CudaCpExchange::down(const void* dev, size_t bytes) {
  check(cudaMemcpyAsync(pinned_, dev, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  drain();
}

void CudaCpExchange::up(void* dev, size_t bytes) {
  check(cudaMemcpyAsync(dev, pinned_ + max_bytes_, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
  drain();  // the pinned buffer is reused by the next call
}

void CudaCpExchange::all_gather(const void* send, void* recv, size_t bytes) {
  const size_t total = bytes * cp_.size;
  KVS_CHECK(bytes % 4 == 0 && total <= max_bytes_, "context-parallel all-gather: {} bytes per rank, planned for {}",
            bytes, max_bytes_ / cp_.size);
  if (bytes == 0) return;
  drain();
  if (device_) {
    cp_.comm->all_gather(send, recv, bytes / 4, dist::DType::F32);
    return;
  }
  down(send, bytes);
  cp_.comm->all_gather(pinned_, pinned_ + max_bytes_, bytes / 4, dist::DType::F32);
  up(recv, total);
}

void CudaCpExchange::pass_on(const void* send, void* recv, size_t bytes) {
  KVS_CHECK(bytes % 4 == 0 && bytes <= max_bytes_, "context-parallel ring: {} bytes, planned for {}", bytes,
            max_bytes_);
  if (bytes == 0) return;
  drain();
  const int next = (cp_.rank + 1) % cp_.size, prev = (cp_.rank + cp_.size - 1) % cp_.size;
  if (device_) {
    cp_.comm->send_recv(send, next, recv, prev, bytes / 4, dist::DType::F32);
    return;
  }
  down(send, bytes);
  cp_.comm->send_recv(pinned_, next, pinned_ + max_bytes_, prev, bytes / 4, dist::DType::F32);
  up(recv, bytes);
}

double CudaCpExchange::sum(double local) {
  cp_.comm->all_reduce(&local, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return local;
}

}  // namespace kvs
#endif  // KVS_CUDA
