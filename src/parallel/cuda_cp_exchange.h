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
// Synchronous either way: simple, and slower than an overlapped ring, which
// the CUDA engine does not have yet. Compiled only with -DKVS_CUDA=ON.
#pragma once
#ifdef KVS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>

#include "parallel/context_parallel.h"

namespace kvs {

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
  // A host value summed over the group.
  double sum(double local);

 private:
  void drain();
  void down(const void* dev, size_t bytes);  // dev -> the pinned send half
  void up(void* dev, size_t bytes);          // the pinned receive half -> dev
  ContextParallel cp_;
  cudaStream_t stream_;
  size_t max_bytes_;
  bool device_ = false;          // the communicator takes device memory
  char* pinned_ = nullptr;       // host path: [max_bytes] send, then [max_bytes] receive
};

}  // namespace kvs
#endif  // KVS_CUDA
