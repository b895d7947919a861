// `bench-attention`: forward and backward TFLOP/s of our flash attention
// kernels at the shapes of a real model (causal, bf16), timed with CUDA
// events, median over repetitions. FLOPs follow FlashAttention's convention:
// forward 4·B·Hq·T²·D / 2 (two matmuls, causal half), backward 2.5x forward.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cli/commands/commands.h"
#include "core/error.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#endif

namespace kvs::cli {

#ifdef KVS_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench-attention: {}: {}", what, cudaGetErrorString(e));
}

struct AttnTiming {
  double fwd_ms, bwd_ms;
};

AttnTiming time_attention(int B, int T, int Hq, int Hkv, int D, int reps) {
  const size_t nq = static_cast<size_t>(B) * T * Hq * D, nkv = static_cast<size_t>(B) * T * Hkv * D;
  const size_t nlse = static_cast<size_t>(B) * Hq * T;
  const size_t scratch = cuda::flash_attention_backward_scratch_floats(B, T, Hq, D);
  std::vector<void*> bufs;
  auto alloc = [&](size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    bufs.push_back(p);
    return p;
  };
  using cuda::bf16;
  auto* q = static_cast<bf16*>(alloc(nq * 2));
  auto* k = static_cast<bf16*>(alloc(nkv * 2));
  auto* v = static_cast<bf16*>(alloc(nkv * 2));
  auto* o = static_cast<bf16*>(alloc(nq * 2));
  auto* dout = static_cast<bf16*>(alloc(nq * 2));
  auto* dq = static_cast<bf16*>(alloc(nq * 2));
  auto* dk = static_cast<bf16*>(alloc(nkv * 2));
  auto* dv = static_cast<bf16*>(alloc(nkv * 2));
  auto* lse = static_cast<float*>(alloc(nlse * 4));
  auto* scr = static_cast<float*>(alloc(std::max<size_t>(scratch, 1) * 4));
  // Small values (0.05) keep the softmax away from one-hot, as in training.
  cuda::fill_bf16(q, 0.05f, nq, nullptr);
  cuda::fill_bf16(k, 0.05f, nkv, nullptr);
  cuda::fill_bf16(v, 0.05f, nkv, nullptr);
  cuda::fill_bf16(dout, 0.05f, nq, nullptr);
  cudaEvent_t e0, e1, e2;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  check(cudaEventCreate(&e2), "event");
  std::vector<double> f, b;
  for (int r = 0; r < reps + 2; ++r) {
    check(cudaEventRecord(e0), "record");
    cuda::flash_attention_forward(o, lse, q, Hq * D, k, v, Hkv * D, B, T, Hq, Hkv, D, nullptr);
    check(cudaEventRecord(e1), "record");
    cuda::flash_attention_backward(dq, dk, dv, dout, o, lse, q, Hq * D, k, v, Hkv * D, B, T, Hq, Hkv, D, scr, nullptr);
    check(cudaEventRecord(e2), "record");
    check(cudaEventSynchronize(e2), "attention kernels");
    float fm = 0, bm = 0;
    cudaEventElapsedTime(&fm, e0, e1);
    cudaEventElapsedTime(&bm, e1, e2);
    if (r >= 2) {  // two warm-up repetitions
      f.push_back(fm);
      b.push_back(bm);
    }
  }
  for (void* p : bufs) cudaFree(p);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  std::sort(f.begin(), f.end());
  std::sort(b.begin(), b.end());
  return {f[f.size() / 2], b[b.size() / 2]};
}

}  // namespace
#endif

void add_bench_attention(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-attention",
                                 "Forward/backward TFLOP/s of the CUDA flash attention kernels (causal, bf16)");
  struct Args {
    int batch = 4, heads = 16, kv_heads = 16, head_dim = 128, reps = 10;
    std::vector<int> seq_lens{1024, 2048, 4096, 8192};
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--batch", a->batch, "Sequences per call")->capture_default_str();
  cmd->add_option("--heads", a->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", a->kv_heads, "KV heads (GQA when fewer than --heads)")->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "Head dimension: 16, 32, 64 or 128")->capture_default_str();
  cmd->add_option("--seq-len", a->seq_lens, "Sequence lengths to time (repeatable)")->capture_default_str();
  cmd->add_option("--reps", a->reps, "Timed repetitions per shape (median reported)")->capture_default_str();
  cmd->callback([a]() {
#ifdef KVS_CUDA
    std::string why;
    if (cuda::device_count(&why) == 0) fail("bench-attention: no usable GPU ({})", why);
    KVS_CHECK(a->heads % a->kv_heads == 0, "bench-attention: --heads ({}) must be a multiple of --kv-heads ({})",
              a->heads, a->kv_heads);
    KVS_CHECK(a->reps >= 1, "bench-attention: --reps must be >= 1");
    std::printf("flash attention on %s: batch %d, heads %d/%d, head_dim %d, causal, bf16 (median of %d)\n",
                cuda::device_name(0).c_str(), a->batch, a->heads, a->kv_heads, a->head_dim, a->reps);
    std::printf("%8s %10s %10s %10s %10s\n", "seq_len", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
    for (int T : a->seq_lens) {
      const AttnTiming t = time_attention(a->batch, T, a->heads, a->kv_heads, a->head_dim, a->reps);
      const double fwd_flops = 4.0 * a->batch * a->heads * static_cast<double>(T) * T * a->head_dim / 2;
      std::printf("%8d %10.3f %10.1f %10.3f %10.1f\n", T, t.fwd_ms, fwd_flops / (t.fwd_ms * 1e9), t.bwd_ms,
                  2.5 * fwd_flops / (t.bwd_ms * 1e9));
    }
#else
    fail("bench-attention: this kvshift was built without CUDA (configure with -DKVS_CUDA=ON)");
#endif
  });
}

}  // namespace kvs::cli
