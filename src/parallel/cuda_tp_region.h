// The edges of a tensor-parallel region on the CUDA engine's device buffers
// (docs/PARALLEL.md "Tensor parallel on CUDA"): Megatron's f and g operators
// as parallel/tp_region.h describes them for the CPU engine, on bf16
// activations (g's forward after the row-parallel matmuls, f's backward on
// the column-parallel input gradients), and the fp32 row statistics of the
// vocab-parallel loss. Two ways, chosen by the TP communicator:
//   - NCCL: enqueued on the engine's stream (ncclAllReduce, bf16 summed by
//     NCCL as in Megatron): no host wait, ordered with the kernels around it;
//   - any host backend (MPI, e.g. two ranks sharing one GPU in the checks):
//     the engine's stream is drained, the buffer copied to pinned host memory,
//     bf16 widened to fp32, all-reduced, rounded back (nearest even) and
//     copied up again. Slow, and there to run the TP code paths with the CUDA
//     kernels where NCCL cannot (docs/LAUNCH.md).
// With sequence parallelism (parallel/tp_region.h) the residual stream holds
// this rank's N/tp rows: f's forward and g's backward become all-gathers
// (gather_bf16), f's backward and g's forward reduce-scatters
// (scatter_sum_bf16), by the same two ways (the staged one sums in fp32 and
// rounds once, as its all-reduce does).
// At tp = 1 every call is a no-op. Compiled only with -DKVS_CUDA=ON.
#pragma once
#ifdef KVS_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "dist/comm.h"
#include "parallel/tensor_parallel.h"

namespace kvs {

namespace dist {
class AsyncDeviceCollectives;
}

class CudaTpRegion {
 public:
  // max_elems: the largest buffer any call passes (elements of either type).
  // sequence_parallel: the residual stream is split over the group (only at tp > 1).
  CudaTpRegion(const TensorParallel& tp, cudaStream_t stream, size_t max_elems, bool sequence_parallel = false);
  ~CudaTpRegion();
  CudaTpRegion(const CudaTpRegion&) = delete;
  CudaTpRegion& operator=(const CudaTpRegion&) = delete;

  // Waits for the engine's stream: cudaStreamSynchronize, or, when NCCL
  // all-reduces may be on it, a poll that fails after the communicator's
  // timeout if a peer died (instead of waiting forever).
  void wait(const char* what);
  // f, backward: the input gradient dx[0..n) (device) summed over the group, in place.
  void enter_backward(__nv_bfloat16* dx, size_t n) { sum_bf16(dx, n); }
  // g, forward: the partial output y[0..n) (device) summed over the group, in place.
  void exit_forward(__nv_bfloat16* y, size_t n) { sum_bf16(y, n); }
  // buf[0..n) (device, fp32) reduced over the TP group with op (Sum or Max), in place.
  void reduce_f32(float* buf, size_t n, dist::ReduceOp op);

  bool sequence_parallel() const { return sp_; }
  // This rank's rows of a region of N rows (N / tp under sequence parallelism).
  size_t local_rows(size_t N) const { return sp_ ? N / tp_.size : N; }
  // full [tp x n] = every rank's local [n], in rank order (device, bf16).
  void gather_bf16(const __nv_bfloat16* local, __nv_bfloat16* full, size_t n);
  // local [n] = this rank's block of full [tp x n] summed over the group.
  void scatter_sum_bf16(const __nv_bfloat16* full, __nv_bfloat16* local, size_t n);

 private:
  void sum_bf16(__nv_bfloat16* buf, size_t n);
  void stage_down(const void* dev, size_t bytes);
  void stage_up(void* dev, size_t bytes);
  TensorParallel tp_;
  bool sp_;
  cudaStream_t stream_;
  size_t max_elems_;
  dist::AsyncDeviceCollectives* nccl_ = nullptr;  // null: staged through the host
  void* pinned_ = nullptr;                        // staged path: [max_elems] fp32 or bf16
  std::vector<float> wide_;                       // staged path: bf16 widened to fp32 ([max_elems])
};

}  // namespace kvs
#endif  // KVS_CUDA
