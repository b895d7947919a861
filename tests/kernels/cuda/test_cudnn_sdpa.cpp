// The cuDNN SDPA attention backend (kernels/cuda/cudnn_sdpa.cpp):
//  - without a GPU: every tensor/operation descriptor of both graphs
//    finalizes (cuDNN validates them on the host), and backend names;
//  - op level: forward out + lse and backward dq/dk/dv against the CPU
//    attention (kernels/cpu attention_forward / attention_backward) run in
//    double on the same bf16-rounded inputs; MHA and GQA (Hq / Hkv = 1, 2, 4),
//    head_dim 64 and 128, T = 37, 64, 130, 257 through ONE CudnnSdpa object
//    built for the largest shape (so the smaller shapes exercise the plan
//    cache and the shared workspace), contiguous and fused-QKV layouts;
//  - model level: CudaEngine with attention_backend "cudnn" against the same
//    engine with "flash" on the same weights: logits, loss, every gradient.
// Every output buffer starts NaN-poisoned (DeviceBuffer), so an element the
// backend does not write fails the comparison. Skipped without a GPU, and
// without cuDNN in the build ("skipped: built without cuDNN").
//
// Tolerances (inputs ~N(0, 1), bf16 storage, fp32 accumulation):
//  - out: rtol 1e-2, atol 1e-2, ||err|| <= 5e-3 ||ref|| (the flash tests'
//    bounds: the bf16 store and P rounded to bf16 before P V).
//  - lse: rtol 1e-4, atol 1e-3. Looser than the flash test's 2e-4 because
//    cuDNN's exponentials/logs are not ours (it may use exp2 with folded
//    log2(e) and fast-math approximations); a wrong scale, mask or sign moves
//    lse by O(0.1 .. 1).
//  - dq, dk, dv: rtol 2e-2, atol 1e-2 max|ref| + 1e-3, ||err|| <= 1e-2 ||ref||
//    (the flash tests' bounds; see test_flash_attention.cpp for the budget).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_attention_problem.h"
#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_backend.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "model/config.h"
#include "model/cuda_engine.h"
#include "model/engine_backend_vs_flash.h"
#include "model/params.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;

#define KVS_REQUIRE_CUDNN()                                                                   \
  do {                                                                                        \
    KVS_REQUIRE_GPU();                                                                        \
    if (!::kvs::cuda::cudnn_available()) GTEST_SKIP() << "skipped: built without cuDNN"; \
  } while (0)

void expect_forward_matches(kc::CudnnSdpa& sdpa, const Problem& p, bool fused) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, fused ? Layout::kFused : Layout::kContiguous));
  DeviceQKV d = upload_qkv(p, fused ? Layout::kFused : Layout::kContiguous);
  DeviceBuffer<bf16> out(s.rows() * s.qd());
  DeviceBuffer<float> lse(s.lse_size());
  sdpa.forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D, nullptr);
  const std::vector<float> got_out = to_f32(out.download()), got_lse = lse.download();
  EXPECT_TRUE(all_close(got_out, to_float(p.out), 1e-2, 1e-2)) << "out";
  EXPECT_TRUE(norm_close(got_out, p.out, 5e-3)) << "out";
  EXPECT_TRUE(all_close(got_lse, to_float(p.lse), 1e-4, 1e-3)) << "lse";
}

// From the reference out (bf16-rounded) and lse, so a failure points at the backward.
void expect_backward_matches(kc::CudnnSdpa& sdpa, const Problem& p, bool fused) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, fused ? Layout::kFused : Layout::kContiguous));
  DeviceQKV d = upload_qkv(p, fused ? Layout::kFused : Layout::kContiguous);
  DeviceBuffer<bf16> out(to_bf16(to_float(p.out))), dout(to_bf16(p.dout));
  DeviceBuffer<float> lse(to_float(p.lse));
  sdpa.backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq,
                s.Hkv, s.D, nullptr, nullptr);
  const std::vector<float> dq = download_strided(d.dq, s.rows(), s.qd(), d.ld_q);
  const std::vector<float> dk = download_strided(d.dk, s.rows(), s.kd(), d.ld_kv);
  const std::vector<float> dv = download_strided(d.dv, s.rows(), s.kd(), d.ld_kv);
  EXPECT_TRUE(all_close(dq, to_float(p.dq), 2e-2, 1e-2 * max_abs(p.dq) + 1e-3)) << "dq";
  EXPECT_TRUE(all_close(dk, to_float(p.dk), 2e-2, 1e-2 * max_abs(p.dk) + 1e-3)) << "dk";
  EXPECT_TRUE(all_close(dv, to_float(p.dv), 2e-2, 1e-2 * max_abs(p.dv) + 1e-3)) << "dv";
  EXPECT_TRUE(norm_close(dq, p.dq, 1e-2)) << "dq";
  EXPECT_TRUE(norm_close(dk, p.dk, 1e-2)) << "dk";
  EXPECT_TRUE(norm_close(dv, p.dv, 1e-2)) << "dv";
}

// head_dim x GQA ratio x layout; per combination one CudnnSdpa built for the
// largest T, then every T (largest first) through it.
template <class F>
void for_each_case(F&& f) {
  const int kT[] = {257, 130, 64, 37};
  int i = 0;
  for (int D : {64, 128})
    for (int Hkv : {4, 2, 1}) {
      const bool fused = i % 2 == 1;
      const Shape max_shape{2, kT[0], 4, Hkv, D};
      const int ld_q = static_cast<int>(fused ? max_shape.qd() + 2 * max_shape.kd() : max_shape.qd());
      const int ld_kv = static_cast<int>(fused ? max_shape.qd() + 2 * max_shape.kd() : max_shape.kd());
      kc::CudnnSdpa sdpa(2, kT[0], 4, Hkv, D, ld_q, ld_kv);
      for (int T : kT) f(sdpa, make_problem(Shape{2, T, 4, Hkv, D}, 2000 + 10 * i + T), fused);
      EXPECT_EQ(sdpa.plans_built(), 4) << "one cached plan pair per (B, T)";
      ++i;
    }
}

}  // namespace

// Runs everywhere: an unknown backend name is stopped where
// train.attention_backend is read, a missing cuDNN before any GPU work.
TEST(CudaCudnnSdpa, BackendSelectionErrors) {
  try {
    kvs::parse_enum<kvs::AttentionImpl>("xformers", "c.json", "train.attention_backend");
    ADD_FAILURE() << "an unknown backend was accepted";
  } catch (const kvs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"xformers\""), std::string::npos) << e.what();
  }
  if (kc::cudnn_available()) {
    EXPECT_NE(kc::cudnn_version_string().find("runtime"), std::string::npos);
    return;
  }
  try {
    kc::make_attention_backend(kvs::AttentionImpl::Cudnn, 1, 8, 2, 2, 64, 128, 128);
    ADD_FAILURE() << "\"cudnn\" was accepted by a build without cuDNN";
  } catch (const kvs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no cuDNN"), std::string::npos) << e.what();
  }
}

// Runs without a GPU (only without cuDNN in the build it skips): every tensor
// and operation descriptor of both graphs finalizes, i.e. cuDNN accepts each
// attribute's type, value and the tensors' dims/strides, for the shapes the
// GPU tests and the engine use. Finding an engine for the graphs still needs
// the GPU tests.
TEST(CudaCudnnSdpa, GraphDescriptorsFinalizeWithoutAGpu) {
  if (!kc::cudnn_available()) GTEST_SKIP() << "skipped: built without cuDNN";
  for (int D : {64, 128})
    for (int Hkv : {4, 2, 1})
      for (int T : {37, 257, 2048})
        for (bool fused : {false, true})
          for (bool deterministic : {false, true}) {
            const int ld_q = fused ? (4 + 2 * Hkv) * D : 4 * D, ld_kv = fused ? ld_q : Hkv * D;
            SCOPED_TRACE(describe(Shape{2, T, 4, Hkv, D}, fused ? Layout::kFused : Layout::kContiguous) + (deterministic ? " deterministic" : ""));
            EXPECT_NO_THROW(kc::CudnnSdpa::check_graphs(2, T, 4, Hkv, D, ld_q, ld_kv, deterministic));
          }
  try {
    kc::CudnnSdpa::check_graphs(2, 64, 4, 2, 64, 256, 128);
  } catch (const kvs::Error& e) {
    ADD_FAILURE() << e.what();  // the message, if the loop above failed without showing it
  }
}

TEST(CudaCudnnSdpa, ForwardMatchesCpu) {
  KVS_REQUIRE_CUDNN();
  for_each_case([](kc::CudnnSdpa& sdpa, const Problem& p, bool fused) { expect_forward_matches(sdpa, p, fused); });
}

TEST(CudaCudnnSdpa, BackwardMatchesCpu) {
  KVS_REQUIRE_CUDNN();
  for_each_case([](kc::CudnnSdpa& sdpa, const Problem& p, bool fused) { expect_backward_matches(sdpa, p, fused); });
}

// Many query tiles, an MQA group of 8, and the deterministic backward
// (no fp32 dQ accumulator): two runs must give the same bits.
TEST(CudaCudnnSdpa, LongSequenceMqaAndDeterministicBackward) {
  KVS_REQUIRE_CUDNN();
  const Shape s{1, 700, 8, 1, 128};
  const Problem p = make_problem(s, 77);
  kc::CudnnSdpa sdpa(s.B, s.T, s.Hq, s.Hkv, s.D, static_cast<int>(s.qd()), static_cast<int>(s.kd()),
                     /*deterministic=*/true);
  expect_forward_matches(sdpa, p, false);
  expect_backward_matches(sdpa, p, false);
  DeviceQKV d = upload_qkv(p, Layout::kContiguous);
  DeviceBuffer<bf16> out(to_bf16(to_float(p.out))), dout(to_bf16(p.dout));
  DeviceBuffer<float> lse(to_float(p.lse));
  std::vector<bf16> first;
  for (int run = 0; run < 2; ++run) {
    d.dqb->poison();
    sdpa.backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq,
                  s.Hkv, s.D, nullptr, nullptr);
    std::vector<bf16> g = d.dqb->download();
    if (run == 0)
      first = g;
    else
      EXPECT_EQ(0, std::memcmp(g.data(), first.data(), g.size() * sizeof(bf16))) << "dq differs between runs";
  }
}

TEST(CudaCudnnSdpa, RejectsShapesItWasNotBuiltFor) {
  KVS_REQUIRE_CUDNN();
  DeviceBuffer<bf16> buf(1 << 16);
  DeviceBuffer<float> lse(1 << 12);
  kc::CudnnSdpa sdpa(1, 64, 4, 2, 64, 256, 128);
  bf16* p = buf.get();
  // other heads / head_dim than built for
  EXPECT_THROW(sdpa.forward(p, lse.get(), p, 256, p, p, 128, 1, 64, 4, 4, 64, nullptr), kvs::Error);
  EXPECT_THROW(sdpa.forward(p, lse.get(), p, 256, p, p, 128, 1, 64, 2, 2, 128, nullptr), kvs::Error);
  // a misaligned pointer
  EXPECT_THROW(sdpa.forward(p + 1, lse.get(), p, 256, p, p, 128, 1, 64, 4, 2, 64, nullptr), kvs::Error);
  // a row stride that is not a multiple of 8 elements
  EXPECT_THROW(sdpa.forward(p, lse.get(), p, 260, p, p, 128, 1, 32, 4, 2, 64, nullptr), kvs::Error);
}

// The whole model with attention_backend "cudnn" against "flash-mma" and the
// CPU engine (tests/model/engine_backend_vs_flash.h has the tolerances and why).
TEST(CudaCudnnSdpa, EngineMatchesTheFlashBackendOnLogitsLossAndEveryGradient) {
  KVS_REQUIRE_CUDNN();
  kvs::testing_util::expect_engine_backend_matches(kvs::AttentionImpl::Cudnn, kvs::AttentionImpl::FlashMma);
}

#endif  // KVS_CUDA
