#include "parallel/tied_embedding.h"

#include <vector>

#include "core/error.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"
#endif

namespace kvs {

void sum_tied_embedding_grads(Engine& e, dist::Communicator* embed_comm) {
  if (!embed_comm) return;
  const ParamTensor* t = e.layout().find("model.embed_tokens.weight");
  KVS_CHECK(t != nullptr, "pipeline: the first or last stage has no embedding to keep tied");
  float* g = e.flat_grads() + t->offset;
  if (!e.flat_on_device() || embed_comm->device_memory()) {
    embed_comm->all_reduce(g, t->numel, dist::DType::F32, dist::ReduceOp::Sum);
    return;
  }
#ifdef KVS_CUDA
  // Every engine call returns with its stream idle: plain copies are ordered after the backward.
  constexpr cuda::ErrorCheck check{"tied embedding (device gradients)"};
  std::vector<float> host(t->numel);
  check(cudaMemcpy(host.data(), g, t->numel * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  embed_comm->all_reduce(host.data(), t->numel, dist::DType::F32, dist::ReduceOp::Sum);
  check(cudaMemcpy(g, host.data(), t->numel * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaDeviceSynchronize(), "tied embedding");  // a pageable copy's DMA may still be in flight
#else
  fail("pipeline: gradients in device memory need a CUDA build");
#endif
}

}  // namespace kvs
