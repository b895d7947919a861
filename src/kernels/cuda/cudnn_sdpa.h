// cuDNN's fused scaled-dot-product attention (its flash SDPA engines) as a
// second attention backend, built with the cuDNN frontend's graph API
// (cudnn_frontend.h, header-only: the sdpa and sdpa_backward nodes, which
// lower to exactly the operation graphs the fused engines accept). Compiled
// only with -DKVS_CUDNN (cuDNN 9 and the frontend's headers found); without it
// the constructor throws "this build has no cuDNN".
//
// Layout: the frontend's tensors are [b, h, s, d] with arbitrary strides, so
// our buffers are described in place: q [B, T, Hq, D] with row stride ld_q is
// dims [B, Hq, T, D], strides [T ld_q, D, ld_q, 1] (k, v, dq, dk, dv alike);
// lse [B, Hq, T] is the stats tensor [B, Hq, T, 1], packed, which the
// forward writes and the backward reads: the natural-log log-sum-exp of the
// scaled scores, our flash attention's convention.
//
// Plans: a graph pair (forward, backward) per (B, T, ld_q, ld_kv), built on
// first use and cached. The constructor builds the pair for the largest shape
// (max_B, max_T) and allocates one device workspace of the size that pair
// needs (for the default backward it includes the fp32 dQ accumulator the
// frontend zeroes before each call), on the expectation that smaller shapes
// need no more. A later, smaller shape builds its pair on the host (once; up
// to seconds when cuDNN compiles the fused kernel at run time) and runs in
// the same workspace; a shape whose plans would need more workspace than was
// allocated fails with an error instead of allocating in the step.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/attention_backend.h"

namespace kvs::cuda {

class CudnnSdpa final : public AttentionBackend {
 public:
  // deterministic: cuDNN's deterministic backward algorithm
  // (set_deterministic_algorithm) instead of the default one, which
  // accumulates dQ with atomics (not bit-reproducible run to run). On Hopper
  // it keeps dP in a workspace of B Hq T^2 bf16 (quadratic in T; cuDNN reports
  // it as the plan's workspace).
  CudnnSdpa(int max_B, int max_T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic = false);
  ~CudnnSdpa() override;
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  const char* name() const override { return "cudnn"; }
  void forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T,
               int Hq, int Hkv, int D, cudaStream_t stream) override;
  void backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse, const bf16* q,
                int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv, int D,
                float* scratch, cudaStream_t stream) override;
  size_t backward_scratch_floats(int, int, int, int) const override { return 0; }
  size_t device_bytes() const override { return workspace_bytes_; }
  // Plan pairs (forward + backward) built so far, one per shape.
  int plans_built() const { return static_cast<int>(plans_.size()); }
  // Builds both graphs for one shape for Hopper (sm90) without a handle or a
  // GPU: the frontend validates them (dims, strides, types, the SDPA support
  // surface of the linked cuDNN) and lowers them to cuDNN, which finalizes
  // every tensor, operation and the operation graph on the host; throws
  // kvs::Error naming the graph, the step and the frontend's message.
  // Finding an engine (heuristics) and building plans still need a GPU.
  static void check_graphs(int B, int T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic = false);

  struct Impl;  // cuDNN and frontend types stay in cudnn_sdpa.cpp

 private:
  struct Plans;
  Plans& plans_for(int B, int T, int ld_q, int ld_kv);
  void check_shape(const char* what, int Hq, int Hkv, int D) const;

  int max_B_, max_T_, Hq_, Hkv_, D_;
  bool deterministic_;
  std::unique_ptr<Impl> impl_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plans>> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace kvs::cuda
