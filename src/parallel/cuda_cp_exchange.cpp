#ifdef KVS_CUDA
#include "parallel/cuda_cp_exchange.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
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
  if (device_) async_ = dist::async_device_collectives(*cp.comm);
  if (async_) {
    check(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&passed_, cudaEventDisableTiming), "cudaEventCreate");
  }
  if (!device_) check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), 2 * max_bytes_), "cudaMallocHost");
}

CudaCpExchange::~CudaCpExchange() {
  if (pinned_) cudaFreeHost(pinned_);
  if (written_) cudaEventDestroy(written_);
  if (passed_) cudaEventDestroy(passed_);
}

void CudaCpExchange::drain() {
  if (async_)  // the engine's stream may wait for a ring step: a peer that died ends in an error, not a hang
    async_->wait_for_stream(stream_, "context-parallel exchange");
  else
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

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

void CudaCpExchange::start_pass_on(const void* send, void* recv, size_t bytes) {
  KVS_CHECK(!passing_, "context-parallel ring: a step is already in flight");
  if (!async_) {  // the host path: the whole step now
    pass_on(send, recv, bytes);
    return;
  }
  KVS_CHECK(bytes % 4 == 0 && bytes <= max_bytes_, "context-parallel ring: {} bytes, planned for {}", bytes,
            max_bytes_);
  if (bytes == 0) return;
  const int next = (cp_.rank + 1) % cp_.size, prev = (cp_.rank + cp_.size - 1) % cp_.size;
  check(cudaEventRecord(written_, stream_), "cudaEventRecord");  // what `send` holds, and `recv`'s last reader
  async_->stream_wait(written_);
  async_->send_recv_async(send, next, recv, prev, bytes);
  async_->record_done(passed_);
  passing_ = true;
}

void CudaCpExchange::finish_pass_on() {
  if (!passing_) return;
  check(cudaStreamWaitEvent(stream_, passed_, 0), "cudaStreamWaitEvent");
  passing_ = false;
}

double CudaCpExchange::sum(double local) {
  cp_.comm->all_reduce(&local, 1, dist::DType::F64, dist::ReduceOp::Sum);
  return local;
}

}  // namespace kvs
#endif  // KVS_CUDA
