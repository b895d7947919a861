// make_attention_backend and the cuDNN build/runtime facts (attention_backend.h).
#include "kernels/cuda/attention_backend.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cudnn_sdpa.h"

#ifdef KVS_CUDNN
#include <cudnn.h>
#include <cudnn_frontend_version.h>
#endif

namespace kvs::cuda {

bool cudnn_available() {
#ifdef KVS_CUDNN
  return true;
#else
  return false;
#endif
}

std::string cudnn_version_string() {
#ifdef KVS_CUDNN
  const size_t rt = cudnnGetVersion();  // major*10000 + minor*100 + patch since cuDNN 9
  return fmt::format("{}.{}.{} (runtime {}.{}.{}), frontend {}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL,
                     rt / 10000, rt / 100 % 100, rt % 100, CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
#else
  return "none";
#endif
}

void AttentionBackend::forward_masked(bf16*, float*, const bf16*, int, const bf16*, const bf16*, int, int, int, int,
                                      int, int, bool, AttentionDocs, cudaStream_t) {
  fail("attention backend {}: no ring-attention blocks or document masks (the flash backends have them)", name());
}

void AttentionBackend::backward_masked(bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*, const bf16*, int,
                                       const bf16*, const bf16*, int, int, int, int, int, int, bool, AttentionDocs,
                                       float*, cudaStream_t) {
  fail("attention backend {}: no ring-attention blocks or document masks (the flash backends have them)", name());
}

std::unique_ptr<AttentionBackend> make_attention_backend(AttentionImpl impl, int max_B, int max_T, int Hq,
                                                         int Hkv, int D, int ld_q, int ld_kv) {
  if (impl == AttentionImpl::Flash && flash_hopper_available(D)) {
    check_flash_hopper(D);
    return std::make_unique<FlashAttentionBackend>(FlashLoads::kHopper);
  }
  if (impl == AttentionImpl::Flash || impl == AttentionImpl::FlashMma) return std::make_unique<FlashAttentionBackend>();
  if (!cudnn_available()) fail("attention backend \"cudnn\": this build has no cuDNN (see docs/CUDA.md)");
  return std::make_unique<CudnnSdpa>(max_B, max_T, Hq, Hkv, D, ld_q, ld_kv);
}

}  // namespace kvs::cuda
