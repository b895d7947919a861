// The context-parallel group's transfers for the CUDA engine
// (parallel/context_parallel.h describes the scheme; model/cuda_engine_cp.cpp
// uses this): the halo all-gathers and the ring's send/receive of device
// buffers, as raw bytes (a multiple of 4, moved as fp32 words: no arithmetic,
// so bf16 pairs and fp32 arrive bit for bit). Each call first drains the
// engine's stream (what it moves must be written), then
//   - NCCL (a device-memory communicator): the collective or the grouped
//     send/recv runs on the communicator's own stream and has finished when
//     the call returns;
//   - any host backend (MPI): through pinned host buffers.
// The exception is the overlapped ring step (start_pass_on, finish_pass_on):
// on NCCL the send/recv is ordered after the engine's work so far by an
// event and runs on the communicator's stream while the engine computes; the
// engine's stream waits for it at finish_pass_on. The host path runs it
// whole in start_pass_on. Compiled only with -DKVS_CUDA=ON.
#pragma once
#ifdef KVS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>

#include "parallel/context_parallel.h"

namespace kvs {
namespace dist {
class AsyncDeviceCollectives;
}

class CudaCpExchange {
 public:
  // max_bytes: the largest send (or all-gather contribution times the group size) any call passes.
  CudaCpExchange(const ContextParallel& cp, cudaStream_t stream, size_t max_bytes);
  ~CudaCpExchange();
  CudaCpExchange(const CudaCpExchange&) = delete;
  CudaCpExchange& operator=(const CudaCpExchange&) = delete;

  const ContextParallel& group() const { return cp_; }
  // recv [size x bytes] = every rank's send [bytes], in rank order (device buffers).
  void all_gather(const void* send, void* recv, size_t bytes);
  // The ring step: send to rank + 1, receive from rank - 1 (device buffers, bytes each).
  void pass_on(const void* send, void* recv, size_t bytes);
  // The same step overlapped with the engine's next kernels: started after
  // everything enqueued on the engine's stream so far; until finish_pass_on
  // (which makes the engine's stream wait for it) those kernels may read
  // `send` but not write it, and must not touch `recv`. One at a time.
  void start_pass_on(const void* send, void* recv, size_t bytes);
  void finish_pass_on();
  // A host value summed over the group.
  double sum(double local);

 private:
  void drain();  // the engine's stream idle (with NCCL's error watch when it may wait for NCCL)
  void down(const void* dev, size_t bytes);  // dev -> the pinned send half
  void up(void* dev, size_t bytes);          // the pinned receive half -> dev
  ContextParallel cp_;
  cudaStream_t stream_;
  size_t max_bytes_;
  bool device_ = false;          // the communicator takes device memory
  dist::AsyncDeviceCollectives* async_ = nullptr;  // the NCCL communicator's stream ops (device_ only)
  cudaEvent_t written_ = nullptr, passed_ = nullptr;  // start_pass_on's two ends (async_ only)
  bool passing_ = false;
  char* pinned_ = nullptr;       // host path: [max_bytes] send, then [max_bytes] receive
};

}  // namespace kvs
#endif  // KVS_CUDA
