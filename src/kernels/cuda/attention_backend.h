// The attention op behind one interface, so the CUDA engine (and
// bench-attention) can run either our hand-written flash attention
// (flash_attention_*.cu) or cuDNN's fused SDPA (cudnn_sdpa.cpp) through a
// pointer. Both implement exactly the contract of flash_attention_forward /
// flash_attention_backward in kernels/cuda/ops.h: causal, scale 1/sqrt(D),
// GQA (query head h reads KV head h / (Hq / Hkv)), q [B, T, Hq, D] with row
// stride ld_q, k/v [B, T, Hkv, D] with row stride ld_kv, out [B, T, Hq, D]
// contiguous, lse fp32 [B, Hq, T] (natural log-sum-exp of the scaled scores),
// dq/dk/dv overwritten with the strides of q/k/v.
//
// Construction fixes the model's shape (Hq, Hkv, D) and the largest
// micro-batch (max_B x max_T); everything a backend needs on the device is
// allocated there, never in forward()/backward().
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/cuda/ops.h"
#include "model/config_enums.h"  // AttentionImpl, the train.attention_backend values

namespace kvs::cuda {

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const char* name() const = 0;
  virtual void forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B,
                       int T, int Hq, int Hkv, int D, cudaStream_t stream) = 0;
  // scratch: fp32, backward_scratch_floats() of them (the flash backward's
  // delta buffer; cuDNN keeps its own workspace and ignores it).
  virtual void backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                        const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                        int Hkv, int D, float* scratch, cudaStream_t stream) = 0;
  virtual size_t backward_scratch_floats(int B, int T, int Hq, int D) const = 0;
  // The forms beyond the contract above, on the flash backends only (others
  // fail): ring attention's blocks (causal false: keys of an earlier chunk,
  // every one visible; ops.h) and document masks (ops.h AttentionDocs).
  virtual void forward_masked(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv,
                              int B, int T, int Hq, int Hkv, int D, bool causal, AttentionDocs docs,
                              cudaStream_t stream);
  virtual void backward_masked(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                               const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq,
                               int Hkv, int D, bool causal, AttentionDocs docs, float* scratch, cudaStream_t stream);
  // Device bytes the backend holds besides the caller's buffers (workspace).
  virtual size_t device_bytes() const { return 0; }
};

// "flash" and "flash-mma": the kernels in flash_attention_*.cu (holds
// nothing). `loads` picks the kernels and their tile loads (ops.h:
// kHopper the wgmma ones where flash_hopper_available, else as kAsync;
// bench-attention times all three).
class FlashAttentionBackend final : public AttentionBackend {
 public:
  explicit FlashAttentionBackend(FlashLoads loads = FlashLoads::kAsync) : loads_(loads) {}
  const char* name() const override {
    return loads_ == FlashLoads::kAsync            ? "flash (mma.sync)"
           : loads_ == FlashLoads::kSync           ? "flash (mma.sync, sync loads)"
           : loads_ == FlashLoads::kHopperGroups2 ? "flash (wgmma, 2 warpgroups per block)"
           : loads_ == FlashLoads::kHopperGroups3 ? "flash (wgmma, 3 warpgroups per block forward, 2 backward)"
                                                   : "flash (wgmma)";
  }
  void forward(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T,
               int Hq, int Hkv, int D, cudaStream_t stream) override {
    flash_attention_forward(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true, loads_, stream);
  }
  void backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse, const bf16* q,
                int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv, int D,
                float* scratch, cudaStream_t stream) override {
    flash_attention_backward(dq, dk, dv, dout, out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true, loads_, scratch,
                             stream);
  }
  void forward_masked(bf16* out, float* lse, const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B,
                      int T, int Hq, int Hkv, int D, bool causal, AttentionDocs docs, cudaStream_t stream) override {
    flash_attention_forward(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, loads_, stream, docs);
  }
  void backward_masked(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                       const bf16* q, int ld_q, const bf16* k, const bf16* v, int ld_kv, int B, int T, int Hq, int Hkv,
                       int D, bool causal, AttentionDocs docs, float* scratch, cudaStream_t stream) override {
    flash_attention_backward(dq, dk, dv, dout, out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, causal, loads_,
                             scratch, stream, docs);
  }
  size_t backward_scratch_floats(int B, int T, int Hq, int D) const override {
    return flash_attention_backward_scratch_floats(B, T, Hq, D);
  }

 private:
  FlashLoads loads_;
};

// The Hopper kernels (FlashLoads::kHopper) against the default ones on one
// small GQA problem (forward out and lse, backward dQ, dK, dV), where
// flash_hopper_available(D): a GPU on which they compute something else fails
// here, in one line naming the output, instead of training on it. The
// "flash" backend runs it when it is made on such a GPU, once per process,
// device and head_dim.
void check_flash_hopper(int D);

// True when this binary was built with cuDNN (-DKVS_CUDNN).
bool cudnn_available();
// The cuDNN version this binary was compiled against, the one loaded at run
// time and the cuDNN frontend's, e.g. "9.19.0 (runtime 9.10.2), frontend
// 1.32.0"; "none" without cuDNN.
std::string cudnn_version_string();

// `impl` is train.attention_backend. ld_q / ld_kv are the row strides the
// engine will pass (plans are built for them).
// Cudnn in a build without cuDNN: kvs::Error "this build has no cuDNN".
std::unique_ptr<AttentionBackend> make_attention_backend(AttentionImpl impl, int max_B, int max_T, int Hq,
                                                         int Hkv, int D, int ld_q, int ld_kv);

}  // namespace kvs::cuda
