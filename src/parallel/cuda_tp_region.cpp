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

CudaTpRegion::CudaTpRegion(const TensorParallel& tp, cudaStream_t stream, size_t max_elems)
    : tp_(tp), stream_(stream), max_elems_(max_elems) {
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

}  // namespace kvs
#endif  // KVS_CUDA
