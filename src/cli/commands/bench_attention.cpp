// `bench-attention`: forward and backward TFLOP/s of our flash attention
// kernels at the shapes of a real model (causal, bf16), and of cuDNN's fused
// SDPA (kernels/cuda/cudnn_sdpa.cpp) at the same shapes in the same run, with
// the ratio ours/cuDNN of fwd+bwd throughput; our kernels' two tile-load
// paths (FlashLoads: cp.async + ldmatrix, and through registers) and the
// Hopper kernels (wgmma) beside the default ones, side by
// side; our kernels with document masks (packed documents of --doc-len
// rows) against causal attention over the whole sequence; then the KV shift + RoPE kernel
// against a device-to-device copy of the same bytes. Timed with CUDA events,
// median over repetitions after two warm-ups. FLOPs follow FlashAttention's
// convention: forward 4·B·Hq·T²·D / 2 (two matmuls, causal half), backward
// 2.5x forward.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "core/error.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/attention_backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/ops.h"
#endif

namespace kvs::cli {

#ifdef KVS_CUDA
namespace {

constexpr cuda::ErrorCheck check{"bench-attention"};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device buffers freed together.
struct Buffers {
  std::vector<void*> ptrs;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc");
    ptrs.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};

struct Events {
  cudaEvent_t e[3];
  Events() {
    for (auto& x : e) check(cudaEventCreate(&x), "cudaEventCreate");
  }
  ~Events() {
    for (auto& x : e) cudaEventDestroy(x);
  }
};

struct AttnTiming {
  double fwd_ms, bwd_ms;
};

// Median forward and backward times of one backend at one shape.
AttnTiming time_attention(cuda::AttentionBackend& attn, int B, int T, int Hq, int Hkv, int D, int reps) {
  const size_t nq = static_cast<size_t>(B) * T * Hq * D, nkv = static_cast<size_t>(B) * T * Hkv * D;
  const size_t nlse = static_cast<size_t>(B) * Hq * T;
  Buffers buf;
  using cuda::bf16;
  auto* q = static_cast<bf16*>(buf.alloc(nq * 2));
  auto* k = static_cast<bf16*>(buf.alloc(nkv * 2));
  auto* v = static_cast<bf16*>(buf.alloc(nkv * 2));
  auto* o = static_cast<bf16*>(buf.alloc(nq * 2));
  auto* dout = static_cast<bf16*>(buf.alloc(nq * 2));
  auto* dq = static_cast<bf16*>(buf.alloc(nq * 2));
  auto* dk = static_cast<bf16*>(buf.alloc(nkv * 2));
  auto* dv = static_cast<bf16*>(buf.alloc(nkv * 2));
  auto* lse = static_cast<float*>(buf.alloc(nlse * 4));
  auto* scr = static_cast<float*>(buf.alloc(attn.backward_scratch_floats(B, T, Hq, D) * 4));
  // Small values (0.05) keep the softmax away from one-hot, as in training.
  cuda::fill_bf16(q, 0.05f, nq, nullptr);
  cuda::fill_bf16(k, 0.05f, nkv, nullptr);
  cuda::fill_bf16(v, 0.05f, nkv, nullptr);
  cuda::fill_bf16(dout, 0.05f, nq, nullptr);
  Events ev;
  std::vector<double> f, b;
  for (int r = 0; r < reps + 2; ++r) {
    check(cudaEventRecord(ev.e[0]), "record");
    attn.forward(o, lse, q, Hq * D, k, v, Hkv * D, B, T, Hq, Hkv, D, nullptr);
    check(cudaEventRecord(ev.e[1]), "record");
    attn.backward(dq, dk, dv, dout, o, lse, q, Hq * D, k, v, Hkv * D, B, T, Hq, Hkv, D, scr, nullptr);
    check(cudaEventRecord(ev.e[2]), "record");
    check(cudaEventSynchronize(ev.e[2]), "attention");
    float fm = 0, bm = 0;
    cudaEventElapsedTime(&fm, ev.e[0], ev.e[1]);
    cudaEventElapsedTime(&bm, ev.e[1], ev.e[2]);
    if (r >= 2) {  // two warm-up repetitions
      f.push_back(fm);
      b.push_back(bm);
    }
  }
  return {median(f), median(b)};
}

struct BandwidthTiming {
  double fwd_ms, bwd_ms, copy_ms;
};

// shift_rope_forward / _backward on x [B, T, H, D] (window 1, RoPE on) and a
// cudaMemcpyAsync of the same tensor, device to device.
BandwidthTiming time_shift_rope(int B, int T, int H, int D, int reps, cuda::ShiftRopeVector vector,
                                cuda::ShiftRopeWalk walk) {
  const size_t n = static_cast<size_t>(B) * T * H * D;
  const int W = 1;
  Buffers buf;
  using cuda::bf16;
  auto* x = static_cast<bf16*>(buf.alloc(n * 2));
  auto* y = static_cast<bf16*>(buf.alloc(n * 2));
  auto* dy = static_cast<bf16*>(buf.alloc(n * 2));
  auto* dx = static_cast<bf16*>(buf.alloc(n * 2));
  auto* coef = static_cast<float*>(buf.alloc(static_cast<size_t>(H) * (W + 1) * 4));
  auto* dcoef = static_cast<float*>(buf.alloc(static_cast<size_t>(H) * (W + 1) * 4));
  auto* cos = static_cast<float*>(buf.alloc(static_cast<size_t>(T) * D / 2 * 4));
  auto* sin = static_cast<float*>(buf.alloc(static_cast<size_t>(T) * D / 2 * 4));
  auto* scr = static_cast<float*>(buf.alloc(cuda::shift_rope_backward_scratch_floats(B, T, H, D, W) * 4));
  cuda::fill_bf16(x, 0.05f, n, nullptr);
  cuda::fill_bf16(dy, 0.05f, n, nullptr);
  cuda::fill_f32(coef, 0.5f, static_cast<size_t>(H) * (W + 1), nullptr);
  cuda::fill_f32(dcoef, 0.0f, static_cast<size_t>(H) * (W + 1), nullptr);
  cuda::fill_f32(cos, 0.8f, static_cast<size_t>(T) * D / 2, nullptr);
  cuda::fill_f32(sin, 0.6f, static_cast<size_t>(T) * D / 2, nullptr);
  const int ld = H * D;
  Events ev;
  std::vector<double> f, b, c;
  for (int r = 0; r < reps + 2; ++r) {
    check(cudaEventRecord(ev.e[0]), "record");
    cuda::shift_rope_forward(y, ld, x, ld, coef, cos, sin, B, T, H, D, W, nullptr, {}, vector, walk);
    check(cudaEventRecord(ev.e[1]), "record");
    cuda::shift_rope_backward(dx, ld, dcoef, dy, ld, x, ld, coef, cos, sin, B, T, H, D, W, scr, nullptr, {}, vector,
                              walk);
    check(cudaEventRecord(ev.e[2]), "record");
    check(cudaEventSynchronize(ev.e[2]), "shift_rope");
    float fm = 0, bm = 0, cm = 0;
    cudaEventElapsedTime(&fm, ev.e[0], ev.e[1]);
    cudaEventElapsedTime(&bm, ev.e[1], ev.e[2]);
    check(cudaEventRecord(ev.e[0]), "record");
    check(cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
    check(cudaEventRecord(ev.e[1]), "record");
    check(cudaEventSynchronize(ev.e[1]), "copy");
    cudaEventElapsedTime(&cm, ev.e[0], ev.e[1]);
    if (r >= 2) {
      f.push_back(fm);
      b.push_back(bm);
      c.push_back(cm);
    }
  }
  return {median(f), median(b), median(c)};
}

// Our kernels (`loads`) with document masks (model.document_boundaries
// "shift_and_attention"): sequences packed with documents of doc_len rows.
// The starts are made and uploaded when T changes (in a warm-up repetition).
class DocumentFlashBackend final : public cuda::AttentionBackend {
 public:
  DocumentFlashBackend(int max_B, int max_T, int doc_len, cuda::FlashLoads loads) : doc_len_(doc_len), loads_(loads) {
    doc_ = static_cast<int32_t*>(buf_.alloc(static_cast<size_t>(max_B) * max_T * sizeof(int32_t)));
  }
  const char* name() const override { return "flash with document masks"; }
  void forward(cuda::bf16* out, float* lse, const cuda::bf16* q, int ld_q, const cuda::bf16* k, const cuda::bf16* v,
               int ld_kv, int B, int T, int Hq, int Hkv, int D, cudaStream_t stream) override {
    starts(B, T);
    cuda::flash_attention_forward(out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true, loads_, stream, {doc_, 0});
  }
  void backward(cuda::bf16* dq, cuda::bf16* dk, cuda::bf16* dv, const cuda::bf16* dout, const cuda::bf16* out,
                const float* lse, const cuda::bf16* q, int ld_q, const cuda::bf16* k, const cuda::bf16* v, int ld_kv,
                int B, int T, int Hq, int Hkv, int D, float* scratch, cudaStream_t stream) override {
    starts(B, T);
    cuda::flash_attention_backward(dq, dk, dv, dout, out, lse, q, ld_q, k, v, ld_kv, B, T, Hq, Hkv, D, true, loads_,
                                   scratch, stream, {doc_, 0});
  }
  size_t backward_scratch_floats(int B, int T, int Hq, int D) const override {
    return cuda::flash_attention_backward_scratch_floats(B, T, Hq, D);
  }

 private:
  void starts(int B, int T) {
    if (B == B_ && T == T_) return;
    std::vector<int32_t> h(static_cast<size_t>(B) * T);
    for (size_t i = 0; i < h.size(); ++i) {
      const int t = static_cast<int>(i % T);
      h[i] = t / doc_len_ * doc_len_;
    }
    check(cudaMemcpy(doc_, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "upload document starts");
    B_ = B, T_ = T;
  }
  Buffers buf_;
  int32_t* doc_ = nullptr;
  int doc_len_, B_ = 0, T_ = 0;
  cuda::FlashLoads loads_;
};

struct NamedBackend {
  const char* name;
  cuda::AttentionBackend& backend;
};

// Two of our kernel paths at the same shapes in the same run, one row per
// sequence length: each one's fwd/bwd ms and TF/s, then how much faster the
// first is (the second's time over the first's, fwd and bwd). Rows read "n/a"
// where the first path is not available.
void compare_flash_paths(const char* title, NamedBackend first, NamedBackend second, const char* ratio_label, int B,
                         int Hq, int Hkv, int D, const std::vector<int>& seq_lens, int reps, bool available = true) {
  std::printf("\n%s\n", title);
  const std::string f = first.name, s = second.name;
  std::printf("%8s | %9s %9s %9s %9s | %9s %9s %9s %9s | %s\n", "seq_len", (f + " fwd").c_str(), "TF/s",
              (f + " bwd").c_str(), "TF/s", (s + " fwd").c_str(), "TF/s", (s + " bwd").c_str(), "TF/s", ratio_label);
  for (int T : seq_lens) {
    if (!available) {
      std::printf("%8d | %9s %9s %9s %9s | %9s %9s %9s %9s | n/a\n", T, "n/a", "", "", "", "n/a", "", "", "");
      continue;
    }
    const AttnTiming a = time_attention(first.backend, B, T, Hq, Hkv, D, reps);
    const AttnTiming b = time_attention(second.backend, B, T, Hq, Hkv, D, reps);
    const double fwd_flops = 4.0 * B * Hq * static_cast<double>(T) * T * D / 2;
    std::printf("%8d | %9.3f %9.1f %9.3f %9.1f | %9.3f %9.1f %9.3f %9.1f | %.2f %.2f\n", T, a.fwd_ms,
                fwd_flops / (a.fwd_ms * 1e9), a.bwd_ms, 2.5 * fwd_flops / (a.bwd_ms * 1e9), b.fwd_ms,
                fwd_flops / (b.fwd_ms * 1e9), b.bwd_ms, 2.5 * fwd_flops / (b.bwd_ms * 1e9), b.fwd_ms / a.fwd_ms,
                b.bwd_ms / a.bwd_ms);
    std::fflush(stdout);
  }
}

}  // namespace
#endif

void add_bench_attention(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-attention",
      "Forward/backward TFLOP/s of our flash attention beside cuDNN SDPA (causal, bf16), and shift+RoPE GB/s vs a copy");
  struct Args {
    int batch = 4, heads = 16, kv_heads = 16, head_dim = 128, reps = 10, doc_len = 1024;
    std::vector<int> seq_lens{1024, 2048, 4096, 8192};
    bool no_cudnn = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--batch", a->batch, "Sequences per call")->capture_default_str();
  cmd->add_option("--heads", a->heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", a->kv_heads, "KV heads (GQA when fewer than --heads)")->capture_default_str();
  cmd->add_option("--head-dim", a->head_dim, "Head dimension: 16, 32, 64 or 128")->capture_default_str();
  cmd->add_option("--seq-len", a->seq_lens, "Sequence lengths to time (repeatable)")->capture_default_str();
  cmd->add_option("--reps", a->reps, "Timed repetitions per shape (median reported)")->capture_default_str();
  cmd->add_flag("--no-cudnn", a->no_cudnn, "Skip the cuDNN SDPA columns (printed as n/a)");
  cmd->add_option("--doc-len", a->doc_len,
                  "Rows per document in the document-mask table (model.document_boundaries \"shift_and_attention\")")
      ->capture_default_str();
  cmd->callback([a]() {
#ifdef KVS_CUDA
    std::string why;
    if (cuda::device_count(&why) == 0) fail("bench-attention: no usable GPU ({})", why);
    KVS_CHECK(a->heads % a->kv_heads == 0, "bench-attention: --heads ({}) must be a multiple of --kv-heads ({})",
              a->heads, a->kv_heads);
    KVS_CHECK(a->reps >= 1, "bench-attention: --reps must be >= 1");
    KVS_CHECK(a->doc_len >= 1, "bench-attention: --doc-len must be >= 1");
    KVS_CHECK(!a->seq_lens.empty(), "bench-attention: --seq-len: give at least one length");
    const int B = a->batch, Hq = a->heads, Hkv = a->kv_heads, D = a->head_dim;
    const bool with_cudnn = cuda::cudnn_available() && !a->no_cudnn;
    std::printf("attention on %s: batch %d, heads %d/%d, head_dim %d, causal, bf16 (median of %d)\n",
                cuda::device_name(0).c_str(), B, Hq, Hkv, D, a->reps);
    std::printf("cuDNN SDPA: %s\n",
                !cuda::cudnn_available() ? "n/a (this build has no cuDNN)"
                : a->no_cudnn            ? "n/a (--no-cudnn)"
                                         : (cuda::cudnn_version_string() +
                                            ", default backward (dQ accumulated with atomics) and the "
                                            "deterministic one (\"det\")")
                                               .c_str());
    // "ours": what train.attention_backend "flash" (the default) runs on this GPU.
    const int max_T = *std::max_element(a->seq_lens.begin(), a->seq_lens.end());
    const std::unique_ptr<cuda::AttentionBackend> ours =
        cuda::make_attention_backend(AttentionImpl::Flash, B, max_T, Hq, Hkv, D, Hq * D, Hkv * D);
    std::printf("ours: %s (train.attention_backend \"flash\", the default, on this GPU)\n", ours->name());
    // Our backward is deterministic (each element one sum in a fixed order);
    // cuDNN's default one is not, its deterministic one is: both ratios.
    std::printf("%8s | %9s %9s %9s %9s | %9s %9s %9s %9s | %s | %9s %9s %s\n", "seq_len", "fwd ms", "fwd TF/s",
                "bwd ms", "bwd TF/s", "cuDNN fwd", "TF/s", "cuDNN bwd", "TF/s", "ours/cuDNN fwd+bwd", "det bwd",
                "TF/s", "ours/cuDNN-det fwd+bwd");
    cuda::FlashAttentionBackend flash;  // the mma.sync kernels ("flash-mma")
    for (int T : a->seq_lens) {
      const AttnTiming t = time_attention(*ours, B, T, Hq, Hkv, D, a->reps);
      const double fwd_flops = 4.0 * B * Hq * static_cast<double>(T) * T * D / 2;
      std::printf("%8d | %9.3f %9.1f %9.3f %9.1f | ", T, t.fwd_ms, fwd_flops / (t.fwd_ms * 1e9), t.bwd_ms,
                  2.5 * fwd_flops / (t.bwd_ms * 1e9));
      if (!with_cudnn) {
        std::printf("%9s %9s %9s %9s | %s | %9s %9s %s\n", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a");
        continue;
      }
      double cudnn_fwd_ms = 0;
      try {
        cuda::CudnnSdpa sdpa(B, T, Hq, Hkv, D, Hq * D, Hkv * D, /*deterministic=*/false);
        const AttnTiming c = time_attention(sdpa, B, T, Hq, Hkv, D, a->reps);
        cudnn_fwd_ms = c.fwd_ms;
        std::printf("%9.3f %9.1f %9.3f %9.1f | %.2f", c.fwd_ms, fwd_flops / (c.fwd_ms * 1e9), c.bwd_ms,
                    2.5 * fwd_flops / (c.bwd_ms * 1e9), (c.fwd_ms + c.bwd_ms) / (t.fwd_ms + t.bwd_ms));
      } catch (const Error& e) {
        std::printf("%9s %9s %9s %9s | n/a (%s)\n", "failed", "", "", "", e.what());
        continue;
      }
      try {  // the same forward; the deterministic backward (its dP workspace grows as T^2)
        cuda::CudnnSdpa det(B, T, Hq, Hkv, D, Hq * D, Hkv * D, /*deterministic=*/true);
        const AttnTiming d = time_attention(det, B, T, Hq, Hkv, D, a->reps);
        std::printf(" | %9.3f %9.1f %.2f\n", d.bwd_ms, 2.5 * fwd_flops / (d.bwd_ms * 1e9),
                    (cudnn_fwd_ms + d.bwd_ms) / (t.fwd_ms + t.bwd_ms));
      } catch (const Error& e) {
        std::printf(" | %9s %9s n/a (%s)\n", "failed", "", e.what());
      }
      std::fflush(stdout);
    }
    std::printf("ours/cuDNN fwd+bwd = cuDNN (fwd+bwd ms) / ours (fwd+bwd ms): above 1 means ours is faster "
                "(target >= 0.8); -det: against cuDNN's deterministic backward (ours is deterministic)\n");

    // Our kernels' two tile-load paths (kernels/cuda/ops.h FlashLoads), the
    // same shapes in the same run: the default (cp.async overlapped with the
    // math, ldmatrix fragments) against the first version (through registers).
    cuda::FlashAttentionBackend flash_sync(cuda::FlashLoads::kSync);
    compare_flash_paths("our mma.sync kernels, tile loads: cp.async + ldmatrix (default) vs through registers (sync):",
                        {"async", flash}, {"sync", flash_sync}, "async/sync speed fwd, bwd", B, Hq, Hkv, D,
                        a->seq_lens, a->reps);
    // The Hopper kernels (wgmma, FlashLoads::kHopper; "flash" on a 9.0 GPU)
    // against the mma.sync ones ("flash-mma"), forward and backward, same
    // shapes, same run.
    cuda::FlashAttentionBackend flash_hopper(cuda::FlashLoads::kHopper);
    compare_flash_paths("our flash attention: Hopper kernels (wgmma) vs mma.sync (cp.async + ldmatrix, \"flash-mma\"):",
                        {"wgmma", flash_hopper}, {"mma", flash}, "wgmma/mma.sync speed fwd, bwd", B, Hq, Hkv, D,
                        a->seq_lens, a->reps, cuda::flash_hopper_available(D));
    if (!cuda::flash_hopper_available(D))
      std::printf("n/a: the Hopper kernels need a build with KVS_CUDA_ARCHS containing 90a, a compute capability "
                  "9.0 GPU and head_dim 64 or 128\n");
    // The Hopper kernels with 2 and 3 warpgroups per block in the forward (128
    // and 192 query rows sharing each K/V tile) and 2 in the backward (128
    // keys or queries sharing the streamed tiles), against the ones "flash"
    // runs (1 warpgroup, 64 rows).
    cuda::FlashAttentionBackend flash_hopper2(cuda::FlashLoads::kHopperGroups2);
    cuda::FlashAttentionBackend flash_hopper3(cuda::FlashLoads::kHopperGroups3);
    for (const auto& [wide, name] : {std::pair{&flash_hopper2, "wg2"}, std::pair{&flash_hopper3, "wg3"}}) {
      const std::string title = std::string("our Hopper kernels: ") + name[2] +
                                " warpgroups per block in the forward, 2 in the backward, vs 1 (\"flash\"):";
      const std::string label = std::string(name) + "/wg1 speed fwd, bwd";
      compare_flash_paths(title.c_str(), {name, *wide}, {"wg1", flash_hopper}, label.c_str(), B, Hq, Hkv, D,
                          a->seq_lens, a->reps, cuda::flash_hopper_available(D));
    }
    // Packed documents (model.document_boundaries "shift_and_attention") on
    // the kernels "flash" runs here (the Hopper ones on a 9.0 GPU), whose
    // tiles outside a block's documents are skipped, against causal attention
    // over the whole sequence on the same kernels. Both columns' TF/s count
    // the causal FLOPs.
    const bool hopper = cuda::flash_hopper_available(D);
    const cuda::FlashLoads loads = hopper ? cuda::FlashLoads::kHopper : cuda::FlashLoads::kAsync;
    DocumentFlashBackend docs(B, max_T, a->doc_len, loads);
    const std::string docs_title = "our flash attention with document masks (documents of " +
                                   std::to_string(a->doc_len) + " rows) vs causal over the whole sequence (" +
                                   (hopper ? "wgmma" : "mma.sync") + "):";
    compare_flash_paths(docs_title.c_str(), {"docs", docs}, {"causal", hopper ? flash_hopper : flash},
                        "docs/causal speed fwd, bwd", B, Hq, Hkv, D, a->seq_lens, a->reps);

    // The KV shift + RoPE kernels are memory bound: their bytes moved per
    // second against cudaMemcpyAsync's on the same tensor. Forward reads x and
    // writes y (2 tensors), backward reads dy and x and writes dx (3), a copy
    // reads and writes one (2); cos/sin, coefficients and scratch are ignored.
    // The last six columns: the same ratio for the other kernel variants,
    // same run: 4-wide accesses (ShiftRopeVector::k4: fewer registers per
    // thread), and the row walks (ShiftRopeWalk::kRows: each row read once) at
    // 8 and 4 wide.
    std::printf("\nKV shift + RoPE (window 1, on a [B, T, %d, %d] tensor) vs a device-to-device copy of it:\n", Hq, D);
    std::printf("%8s | %9s %9s %9s %9s | %9s %9s | %9s %9s | %9s %9s | %9s %9s | %9s %9s\n", "seq_len", "fwd ms",
                "fwd GB/s", "bwd ms", "bwd GB/s", "copy ms", "copy GB/s", "fwd/copy", "bwd/copy", "4w f/copy",
                "4w b/copy", "8wr f/cp", "8wr b/cp", "4wr f/cp", "4wr b/cp");
    using SV = cuda::ShiftRopeVector;
    using SW = cuda::ShiftRopeWalk;
    for (int T : a->seq_lens) {
      const double bytes = static_cast<double>(B) * T * Hq * D * 2;  // one bf16 tensor
      const BandwidthTiming t = time_shift_rope(B, T, Hq, D, a->reps, SV::k8, SW::kUnits);
      const double cg = 2 * bytes / (t.copy_ms * 1e6);
      std::printf("%8d | %9.3f %9.1f %9.3f %9.1f | %9.3f %9.1f", T, t.fwd_ms, 2 * bytes / (t.fwd_ms * 1e6), t.bwd_ms,
                  3 * bytes / (t.bwd_ms * 1e6), t.copy_ms, cg);
      // Each variant against the copy timed in its own run.
      const auto ratios = [&](const BandwidthTiming& v) {
        const double c = 2 * bytes / (v.copy_ms * 1e6);
        std::printf(" | %9.2f %9.2f", 2 * bytes / (v.fwd_ms * 1e6) / c, 3 * bytes / (v.bwd_ms * 1e6) / c);
      };
      ratios(t);
      ratios(time_shift_rope(B, T, Hq, D, a->reps, SV::k4, SW::kUnits));
      ratios(time_shift_rope(B, T, Hq, D, a->reps, SV::k8, SW::kRows));
      ratios(time_shift_rope(B, T, Hq, D, a->reps, SV::k4, SW::kRows));
      std::printf("\n");
      std::fflush(stdout);
    }
#else
    fail("bench-attention: this kvshift was built without CUDA (configure with -DKVS_CUDA=ON)");
#endif
  });
}

}  // namespace kvs::cli
