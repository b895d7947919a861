#ifdef KVS_CUDA
#include "parallel/cuda_tp_region.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/safetensors.h"  // f32_to_bf16 (nearest even), bf16_to_f32
#include "dist/nccl_comm.h"
#include "kernels/cuda/check.h"

namespace kvs {

namespace {

constexpr cuda::ErrorCheck check{"tensor-parallel all-reduce"};

}  // namespace

CudaTpRegion::CudaTpRegion(const TensorParallel& tp, cudaStream_t stream, size_t max_elems, bool sequence_parallel)
    : tp_(tp), sp_(sequence_parallel && tp.size > 1), stream_(stream), max_elems_(max_elems) {
  if (tp_.size == 1) return;
  KVS_CHECK(tp_.comm != nullptr, "CUDA engine: tensor parallelism (tp = {}) without a communicator", tp_.size);
  nccl_ = dist::async_device_collectives(*tp_.comm);
  if (!nccl_) {
    check(cudaMallocHost(&pinned_, max_elems_ * sizeof(float)), "cudaMallocHost");
    wide_.resize(max_elems_);
  }
}

CudaTpRegion::~CudaTpRegion() {
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaTpRegion::stage_down(const void* dev, size_t bytes) {
  check(cudaMemcpyAsync(pinned_, dev, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
  check(cudaStreamSynchronize(stream_), "copy to host");
}

void CudaTpRegion::stage_up(void* dev, size_t bytes) {
  check(cudaMemcpyAsync(dev, pinned_, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
  // The pinned buffer is reused by the next call: wait for the copy.
  check(cudaStreamSynchronize(stream_), "copy to device");
}

void CudaTpRegion::wait(const char* what) {
  if (nccl_) {
    nccl_->wait_for_stream(stream_, what);
    return;
  }
  cuda::check(cudaStreamSynchronize(stream_), "CUDA engine", what);
}

void CudaTpRegion::sum_bf16(__nv_bfloat16* buf, size_t n) {
  if (tp_.size == 1 || n == 0) return;
  KVS_CHECK(n <= max_elems_, "tensor-parallel all-reduce: {} elements, planned for {}", n, max_elems_);
  if (nccl_) {
    nccl_->all_reduce_on_stream(buf, n, dist::AsyncDeviceCollectives::Elem::BF16, dist::ReduceOp::Sum, stream_);
    return;
  }
  stage_down(buf, n * sizeof(uint16_t));
  const auto* bits = static_cast<const uint16_t*>(pinned_);
  for (size_t i = 0; i < n; ++i) wide_[i] = bf16_to_f32(bits[i]);
  tp_.comm->all_reduce(wide_.data(), n, dist::DType::F32, dist::ReduceOp::Sum);
  auto* out = static_cast<uint16_t*>(pinned_);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(wide_[i]);
  stage_up(buf, n * sizeof(uint16_t));
}

void CudaTpRegion::reduce_f32(float* buf, size_t n, dist::ReduceOp op) {
  if (tp_.size == 1 || n == 0) return;
  KVS_CHECK(n <= max_elems_, "tensor-parallel all-reduce: {} elements, planned for {}", n, max_elems_);
  if (nccl_) {
    nccl_->all_reduce_on_stream(buf, n, dist::AsyncDeviceCollectives::Elem::F32, op, stream_);
    return;
  }
  stage_down(buf, n * sizeof(float));
  tp_.comm->all_reduce(pinned_, n, dist::DType::F32, op);
  stage_up(buf, n * sizeof(float));
}

void CudaTpRegion::gather_bf16(const __nv_bfloat16* local, __nv_bfloat16* full, size_t n) {
  if (n == 0) return;
  const size_t total = n * tp_.size;
  KVS_CHECK(sp_, "sequence-parallel all-gather without sequence parallelism");
  KVS_CHECK(total <= max_elems_, "sequence-parallel all-gather: {} elements, planned for {}", total, max_elems_);
  if (nccl_) {
    nccl_->all_gather_on_stream(local, full, n, dist::AsyncDeviceCollectives::Elem::BF16, stream_);
    return;
  }
  // Gathered as fp32 (the host communicator has no 16-bit type); bf16 -> fp32
  // -> bf16 is exact, so the rows arrive unchanged.
  stage_down(local, n * sizeof(uint16_t));
  const auto* bits = static_cast<const uint16_t*>(pinned_);
  for (size_t i = 0; i < n; ++i) wide_[i] = bf16_to_f32(bits[i]);
  auto* gathered = static_cast<float*>(pinned_);
  tp_.comm->all_gather(wide_.data(), gathered, n, dist::DType::F32);
  // Narrowed in place, front to back: element i's 2 bytes land at or before its 4.
  auto* out = static_cast<uint16_t*>(pinned_);
  for (size_t i = 0; i < total; ++i) out[i] = f32_to_bf16(gathered[i]);
  stage_up(full, total * sizeof(uint16_t));
}

void CudaTpRegion::scatter_sum_bf16(const __nv_bfloat16* full, __nv_bfloat16* local, size_t n) {
  if (n == 0) return;
  const size_t total = n * tp_.size;
  KVS_CHECK(sp_, "sequence-parallel reduce-scatter without sequence parallelism");
  KVS_CHECK(total <= max_elems_, "sequence-parallel reduce-scatter: {} elements, planned for {}", total, max_elems_);
  if (nccl_) {
    nccl_->reduce_scatter_on_stream(full, local, n, dist::AsyncDeviceCollectives::Elem::BF16, dist::ReduceOp::Sum,
                                    stream_);
    return;
  }
  stage_down(full, total * sizeof(uint16_t));
  const auto* bits = static_cast<const uint16_t*>(pinned_);
  for (size_t i = 0; i < total; ++i) wide_[i] = bf16_to_f32(bits[i]);
  auto* summed = static_cast<float*>(pinned_);
  tp_.comm->reduce_scatter(wide_.data(), summed, n, dist::DType::F32, dist::ReduceOp::Sum);
  auto* out = static_cast<uint16_t*>(pinned_);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(summed[i]);
  stage_up(local, n * sizeof(uint16_t));
}

}  // namespace kvs
#endif  // KVS_CUDA
