// cuDNN's fused scaled-dot-product attention ("flash" SDPA engines) as a
// second attention backend, written against cuDNN 9's C backend graph API
// (cudnn_graph.h; cudnn-frontend is not used). Compiled only with -DKVS_CUDNN;
// without it the constructor throws "this build has no cuDNN".
//
// The operation graphs are the ones cudnn-frontend's SDPA nodes lower to
// (the pattern cuDNN's fused-attention engines recognise):
//   forward:  S = Q K^T; S *= scale; S = row >= col ? S : lowest;
//             m = rowmax S; E = exp(S - m); l = rowsum E;
//             stats = m + log l  (written: our lse); P = E / l (bf16); O = P V
//   backward: delta = rowsum(dO * O); S = scale Q K^T (masked as above);
//             P = exp(S - stats); dV = P^T dO; dS = P * (dO V^T - delta) * scale;
//             dK = dS^T Q; dQ = dS K (accumulated in an fp32 workspace tensor,
//             then converted). GQA: Q/dO carry Hq heads and K/V Hkv; the
//             matmuls broadcast K/V over each group and dK/dV are summed over
//             the group by a reduction node.
// Layout: cuDNN tensors are [b, h, s, d] with arbitrary strides, so our
// buffers are described in place: q [B, T, Hq, D] with row stride ld_q is
// dims [B, Hq, T, D], strides [T ld_q, D, ld_q, 1]; K^T is dims
// [B, Hkv, D, T], strides [T ld_kv, D, 1, ld_kv]; lse [B, Hq, T] is the stats
// tensor [B, Hq, T, 1], strides [Hq T, T, 1, 1].
//
// Plans: an execution plan pair (forward, backward) per (B, T, ld_q, ld_kv),
// built on first use and cached. The constructor builds the pair for the
// largest shape (max_B, max_T) and allocates one device workspace of the
// size that pair needs (the plans' own workspace plus the fp32 dQ
// accumulator, B Hq T D floats), on the expectation that smaller shapes need
// no more. A later, smaller shape builds its plans on the host (once; up to
// seconds when cuDNN compiles the fused kernel at run time) and runs in the
// same workspace; a shape whose plans would need more workspace than was
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
  // deterministic: build the backward without the fp32 dQ accumulator (cuDNN's
  // deterministic "dP workspace" algorithm) instead of the default one, which
  // accumulates dQ with atomics (not bit-reproducible run to run). On Hopper
  // the deterministic graph runs with a dP workspace of B Hq T^2 bf16
  // (quadratic in T; cuDNN reports it as the plan's workspace).
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
  // Builds and finalizes every tensor and operation descriptor of both graphs
  // for one shape, without a handle or a GPU (cuDNN validates descriptors on
  // the host); throws kvs::Error naming the first call cuDNN refuses. The
  // operation graph and the engines still need a GPU.
  static void check_graphs(int B, int T, int Hq, int Hkv, int D, int ld_q, int ld_kv, bool deterministic = false);

  struct Impl;  // cuDNN types stay in cudnn_sdpa.cpp

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
