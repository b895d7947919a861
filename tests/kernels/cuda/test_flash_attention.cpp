// CUDA flash attention (kernels/cuda/flash_attention_*.cu) against the CPU
// attention (kernels/cpu attention_forward / attention_backward) run in double
// on the same bf16-rounded inputs. Covers MHA and GQA (Hq / Hkv = 1, 2, 4),
// every supported head_dim, sequence lengths that are not multiples of the
// 64-row tiles, B = 2, and three memory layouts for Q/K/V and dQ/dK/dV:
// contiguous, a fused [N, (Hq + 2 Hkv) D] projection buffer, and padded rows
// (ld > H*D, whose padding must stay untouched). Every output buffer starts
// NaN-poisoned, so an element a kernel forgets to write fails the comparison.
//
// Tolerances (inputs ~N(0, 1); all sums in fp32, so the error budget is the
// bf16 roundings):
//  - out (bf16): rtol 1e-2, atol 1e-2, and ||err|| <= 5e-3 ||ref||. out is a
//    convex combination of V rows (|v| < 5); its bf16 store costs 2^-9 = 0.2%
//    relative and P enters the P V product rounded to bf16 (another <= 0.2% per
//    weight, random in sign). fp32 accumulation adds ~1e-6.
//  - lse (fp32): rtol 1e-5, atol 2e-4. Scores are sums of exact bf16 products
//    in fp32 and exp2f/logf are within 2 ulp, so the error is ~1e-6 absolute
//    for |lse| < 10 (~1e-5 for the peaked test, |lse| ~ 50).
//  - dq, dk, dv (bf16): rtol 2e-2, atol 1e-2 * max|ref| + 1e-3, and
//    ||err|| <= 1e-2 ||ref|| (2e-2 for the peaked softmax). Besides the 0.2%
//    bf16 store, P (for dV) and dS (for dQ, dK) are rounded to bf16 before
//    the MMAs that consume them and delta = rowsum(dO * O) reads the bf16 O.
//    A gradient element is a sum over up to T such terms whose rows of dS sum
//    to zero, so elements that cancel to ~0 carry an error relative to the
//    tensor's largest terms, not to themselves: hence the max-scaled atol
//    (+1e-3 for T = 1, where dq = dk = 0 exactly and only fp32 rounding of
//    dP - delta remains).
// An indexing or masking bug gives O(1) relative errors, far outside these.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_attention_problem.h"
#include "cuda_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_backend.h"
#include "kernels/cuda/ops.h"

namespace {

using namespace kvs::cuda_test;
namespace kc = kvs::cuda;


// Both tile-load paths of the forward (kc::FlashLoads), each into fresh
// NaN-poisoned buffers; the default (cp.async + ldmatrix) first. They feed the
// same MMAs in the same order, so their results are also bit-identical.
void expect_forward_matches(const Problem& p, Layout layout) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, layout));
  DeviceQKV d = upload_qkv(p, layout);
  std::vector<float> first_out, first_lse;
  for (const kc::FlashLoads loads : {kc::FlashLoads::kAsync, kc::FlashLoads::kSync}) {
    SCOPED_TRACE(loads == kc::FlashLoads::kAsync ? "cp.async + ldmatrix" : "sync loads");
    DeviceBuffer<bf16> out(s.rows() * s.qd());
    DeviceBuffer<float> lse(s.lse_size());
    kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                                true, loads, nullptr);
    const std::vector<float> got_out = to_f32(out.download()), got_lse = lse.download();
    EXPECT_TRUE(all_close(got_out, to_float(p.out), 1e-2, 1e-2)) << "out";
    EXPECT_TRUE(norm_close(got_out, p.out, 5e-3)) << "out";
    EXPECT_TRUE(all_close(got_lse, to_float(p.lse), 1e-5, 2e-4)) << "lse";
    if (first_out.empty()) {
      first_out = got_out, first_lse = got_lse;
    } else {
      EXPECT_EQ(0, std::memcmp(first_out.data(), got_out.data(), got_out.size() * sizeof(float))) << "out bits";
      EXPECT_EQ(0, std::memcmp(first_lse.data(), got_lse.data(), got_lse.size() * sizeof(float))) << "lse bits";
    }
  }
  // The Hopper forward (wgmma; kHopper) where this build and GPU have it: the
  // same tolerances (another accumulation order: not the same bits).
  if (kc::flash_hopper_available(s.D)) {
    SCOPED_TRACE("Hopper forward (wgmma)");
    DeviceBuffer<bf16> out(s.rows() * s.qd());
    DeviceBuffer<float> lse(s.lse_size());
    kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                                true, kc::FlashLoads::kHopper, nullptr);
    const std::vector<float> got_out = to_f32(out.download()), got_lse = lse.download();
    EXPECT_TRUE(all_close(got_out, to_float(p.out), 1e-2, 1e-2)) << "out";
    EXPECT_TRUE(norm_close(got_out, p.out, 5e-3)) << "out";
    EXPECT_TRUE(all_close(got_lse, to_float(p.lse), 1e-5, 2e-4)) << "lse";
  }
}

// The backward from the reference out (bf16-rounded) and lse (fp32), so that
// a failure here points at the backward kernels only. Both tile-load paths,
// each on freshly uploaded (NaN-poisoned) gradient buffers; bit-identical. And
// the Hopper kernels where this build and GPU have them (same tolerances).
void expect_backward_matches(const Problem& p, Layout layout, double norm_rel = 1e-2) {
  const Shape& s = p.s;
  SCOPED_TRACE(describe(s, layout));
  DeviceBuffer<bf16> out(to_bf16(to_float(p.out))), dout(to_bf16(p.dout));
  DeviceBuffer<float> lse(to_float(p.lse));
  DeviceBuffer<float> scratch(kc::flash_attention_backward_scratch_floats(s.B, s.T, s.Hq, s.D));
  std::vector<float> first;
  for (const kc::FlashLoads loads : {kc::FlashLoads::kAsync, kc::FlashLoads::kSync, kc::FlashLoads::kHopper}) {
    if (loads == kc::FlashLoads::kHopper && !kc::flash_hopper_available(s.D)) continue;
    SCOPED_TRACE(loads == kc::FlashLoads::kAsync  ? "cp.async + ldmatrix"
                 : loads == kc::FlashLoads::kSync ? "sync loads"
                                                  : "Hopper (wgmma)");
    DeviceQKV d = upload_qkv(p, layout);
    kc::flash_attention_backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv,
                                 s.B, s.T, s.Hq, s.Hkv, s.D, true, loads, scratch.get(), nullptr);
    size_t untouched = 0;
    size_t* pad = layout == Layout::kPadded ? &untouched : nullptr;
    const std::vector<float> dq = download_strided(d.dq, s.rows(), s.qd(), d.ld_q, pad);
    const std::vector<float> dk = download_strided(d.dk, s.rows(), s.kd(), d.ld_kv, pad);
    const std::vector<float> dv = download_strided(d.dv, s.rows(), s.kd(), d.ld_kv, pad);
    EXPECT_TRUE(all_close(dq, to_float(p.dq), 2e-2, 1e-2 * max_abs(p.dq) + 1e-3)) << "dq";
    EXPECT_TRUE(all_close(dk, to_float(p.dk), 2e-2, 1e-2 * max_abs(p.dk) + 1e-3)) << "dk";
    EXPECT_TRUE(all_close(dv, to_float(p.dv), 2e-2, 1e-2 * max_abs(p.dv) + 1e-3)) << "dv";
    EXPECT_TRUE(norm_close(dq, p.dq, norm_rel)) << "dq";
    EXPECT_TRUE(norm_close(dk, p.dk, norm_rel)) << "dk";
    EXPECT_TRUE(norm_close(dv, p.dv, norm_rel)) << "dv";
    EXPECT_EQ(untouched, 0u) << "padding columns of dq/dk/dv were written";
    std::vector<float> all(dq);
    all.insert(all.end(), dk.begin(), dk.end());
    all.insert(all.end(), dv.begin(), dv.end());
    if (first.empty()) {
      first = all;
    } else if (loads != kc::FlashLoads::kHopper) {  // the Hopper kernels: another accumulation order on a GPU
      EXPECT_EQ(0, std::memcmp(first.data(), all.data(), all.size() * sizeof(float))) << "dq/dk/dv bits";
    }
  }
}

// The sweep shared by the forward and backward tests: every head_dim x
// sequence length x GQA ratio, B = 2, Hq = 4, the three layouts in rotation.
template <class F>
void for_each_case(F&& f) {
  int i = 0;
  for (int D : {16, 32, 64, 128})
    for (int T : {1, 37, 64, 130, 257})
      for (int Hkv : {4, 2, 1}) {
        const Layout layout = static_cast<Layout>(i % 3);
        f(make_problem(Shape{2, T, 4, Hkv, D}, 1000 + 10 * i), layout);
        ++i;
      }
}

TEST(CudaAttention, ForwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for_each_case([](const Problem& p, Layout l) { expect_forward_matches(p, l); });
}

TEST(CudaAttention, BackwardMatchesCpu) {
  KVS_REQUIRE_GPU();
  for_each_case([](const Problem& p, Layout l) { expect_backward_matches(p, l); });
}

// Many tiles per row, an MQA group of 8 query heads per KV head, head_dim 128.
TEST(CudaAttention, LongSequenceMqa) {
  KVS_REQUIRE_GPU();
  const Problem p = make_problem(Shape{2, 700, 8, 1, 128}, 77);
  expect_forward_matches(p, Layout::kFused);
  expect_backward_matches(p, Layout::kPadded);
}

// Scores with a standard deviation of ~16: the online softmax's running max
// changes by large steps between key tiles and most probabilities underflow.
// dS rows sum to zero, and with a peaked P the gradients cancel more, so the
// aggregate bound on dq/dk/dv is 2e-2 here (see the top of the file).
TEST(CudaAttention, PeakedSoftmax) {
  KVS_REQUIRE_GPU();
  const Problem p = make_problem(Shape{2, 257, 4, 2, 64}, 55, 4.0f);
  expect_forward_matches(p, Layout::kFused);
  expect_backward_matches(p, Layout::kFused, 2e-2);
}

// Forward then backward twice on the same inputs (outputs re-poisoned in
// between): the results must be bit-identical (no atomics, fixed order).
TEST(CudaAttention, ForwardAndBackwardAreDeterministic) {
  KVS_REQUIRE_GPU();
  for (const Shape s : {Shape{2, 257, 8, 2, 64}, Shape{2, 200, 4, 1, 128}, Shape{3, 130, 4, 4, 32}}) {
    SCOPED_TRACE(describe(s, Layout::kFused));
    Problem p;
    p.s = s;
    p.q = random_bf16_values(s.rows() * s.qd(), 5);
    p.k = random_bf16_values(s.rows() * s.kd(), 6);
    p.v = random_bf16_values(s.rows() * s.kd(), 7);
    p.dout = random_bf16_values(s.rows() * s.qd(), 8);
    DeviceQKV d = upload_qkv(p, Layout::kFused);
    DeviceBuffer<bf16> out(s.rows() * s.qd()), dout(to_bf16(p.dout));
    DeviceBuffer<float> lse(s.lse_size());
    DeviceBuffer<float> scratch(kc::flash_attention_backward_scratch_floats(s.B, s.T, s.Hq, s.D));
    for (const kc::FlashLoads loads : {kc::FlashLoads::kAsync, kc::FlashLoads::kHopper}) {
      if (loads == kc::FlashLoads::kHopper && !kc::flash_hopper_available(s.D)) continue;
      SCOPED_TRACE(loads == kc::FlashLoads::kHopper ? "Hopper (wgmma)" : "default");
      std::vector<bf16> first_out, first_dqkv;
      std::vector<float> first_lse;
      for (int run = 0; run < 2; ++run) {
        out.poison();
        lse.poison();
        d.dqb->poison();
        kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                                    true, loads, nullptr);
        kc::flash_attention_backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v,
                                     d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D, true, loads, scratch.get(), nullptr);
        std::vector<bf16> o = out.download(), g = d.dqb->download();
        std::vector<float> l = lse.download();
        const size_t unwritten =
            std::count_if(g.begin(), g.end(), [](bf16 x) { return std::isnan(__bfloat162float(x)); });
        EXPECT_EQ(unwritten, 0u) << "elements of dq/dk/dv not written (run " << run << ")";
        if (run == 0) {
          first_out = std::move(o);
          first_dqkv = std::move(g);
          first_lse = std::move(l);
        } else {
          EXPECT_EQ(0, std::memcmp(o.data(), first_out.data(), o.size() * sizeof(bf16))) << "out differs";
          EXPECT_EQ(0, std::memcmp(l.data(), first_lse.data(), l.size() * sizeof(float))) << "lse differs";
          EXPECT_EQ(0, std::memcmp(g.data(), first_dqkv.data(), g.size() * sizeof(bf16))) << "dq/dk/dv differ";
        }
      }
    }
  }
}

// The Hopper kernels with 2 and 3 warpgroups per block (FlashLoads::
// kHopperGroups2/3: the same products per row in the same order, the tiles a
// warpgroup does not see masked whole) give the one-warpgroup kernels' bits,
// forward and backward, through their launchers (grids of 128 and 192 rows,
// 256 and 384 threads, their shared memory). Also in the host build's ctest.
TEST(CudaHopperBlocks, WiderBlocksGiveTheOneWarpgroupBits) {
  KVS_REQUIRE_GPU();
  int seed = 1500;
  for (const Shape s : {Shape{2, 130, 4, 2, 64}, Shape{1, 257, 2, 2, 128}, Shape{2, 37, 4, 1, 64}}) {
    if (!kc::flash_hopper_available(s.D)) GTEST_SKIP() << "no Hopper kernels on this build and GPU";
    SCOPED_TRACE(describe(s, Layout::kFused));
    const Problem p = make_problem(s, seed++);
    DeviceBuffer<bf16> out(s.rows() * s.qd()), dout(to_bf16(p.dout));
    DeviceBuffer<float> lse(s.lse_size());
    DeviceBuffer<float> scratch(kc::flash_attention_backward_scratch_floats(s.B, s.T, s.Hq, s.D));
    std::vector<bf16> first_out, first_dqkv;
    std::vector<float> first_lse;
    for (const kc::FlashLoads loads :
         {kc::FlashLoads::kHopper, kc::FlashLoads::kHopperGroups2, kc::FlashLoads::kHopperGroups3}) {
      SCOPED_TRACE(kc::FlashAttentionBackend(loads).name());
      DeviceQKV d = upload_qkv(p, Layout::kFused);  // NaN-poisoned gradients
      out.poison();
      lse.poison();
      kc::flash_attention_forward(out.get(), lse.get(), d.q, d.ld_q, d.k, d.v, d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D,
                                  true, loads, nullptr);
      kc::flash_attention_backward(d.dq, d.dk, d.dv, dout.get(), out.get(), lse.get(), d.q, d.ld_q, d.k, d.v,
                                   d.ld_kv, s.B, s.T, s.Hq, s.Hkv, s.D, true, loads, scratch.get(), nullptr);
      const std::vector<bf16> got_out = out.download(), got_dqkv = d.dqb->download();
      const std::vector<float> got_lse = lse.download();
      if (first_out.empty()) {  // the one-warpgroup kernels against the CPU, as in expect_*_matches
        EXPECT_TRUE(norm_close(to_f32(got_out), p.out, 5e-3)) << "out";
        EXPECT_TRUE(all_close(got_lse, to_float(p.lse), 1e-5, 2e-4)) << "lse";
        EXPECT_TRUE(norm_close(download_strided(d.dq, s.rows(), s.qd(), d.ld_q, nullptr), p.dq, 1e-2)) << "dq";
        EXPECT_TRUE(norm_close(download_strided(d.dk, s.rows(), s.kd(), d.ld_kv, nullptr), p.dk, 1e-2)) << "dk";
        EXPECT_TRUE(norm_close(download_strided(d.dv, s.rows(), s.kd(), d.ld_kv, nullptr), p.dv, 1e-2)) << "dv";
        first_out = got_out, first_lse = got_lse, first_dqkv = got_dqkv;
        continue;
      }
      EXPECT_EQ(0, std::memcmp(first_out.data(), got_out.data(), got_out.size() * sizeof(bf16))) << "out bits";
      EXPECT_EQ(0, std::memcmp(first_lse.data(), got_lse.data(), got_lse.size() * sizeof(float))) << "lse bits";
      EXPECT_EQ(0, std::memcmp(first_dqkv.data(), got_dqkv.data(), got_dqkv.size() * sizeof(bf16)))
          << "dq/dk/dv bits";
    }
  }
}

// The Hopper kernels are there exactly when the build has sm_90a code
// (KVS_CUDA_SM90A) and the GPU is compute capability 9.0, for head_dim 64 and
// 128: a GPU run that silently fell back to the mma.sync kernels would
// otherwise go unnoticed (Forward/BackwardMatchesCpu check them wherever they are there).
TEST(CudaAttention, HopperKernelsAreThereOnAn90aBuildAndA90Gpu) {
  KVS_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
#ifdef KVS_CUDA_SM90A
  const bool want = major == 9 && minor == 0;
#else
  const bool want = false;
#endif
  EXPECT_EQ(kc::flash_hopper_available(64), want) << "compute capability " << major << "." << minor;
  EXPECT_EQ(kc::flash_hopper_available(128), want) << "compute capability " << major << "." << minor;
  EXPECT_FALSE(kc::flash_hopper_available(32));
  EXPECT_FALSE(kc::flash_hopper_available(16));
  // The self-check passes where they are there (and does nothing elsewhere).
  for (const int D : {16, 64, 128}) EXPECT_NO_THROW(kc::check_flash_hopper(D)) << "head_dim " << D;
  // The "flash" backend runs them where they are there; "flash-mma" never does.
  for (const int D : {16, 64, 128}) {
    const auto flash = kc::make_attention_backend(kvs::AttentionImpl::Flash, 1, 64, 2, 1, D, 2 * D, D);
    const auto mma = kc::make_attention_backend(kvs::AttentionImpl::FlashMma, 1, 64, 2, 1, D, 2 * D, D);
    EXPECT_STREQ(flash->name(), want && D != 16 ? "flash (wgmma)" : "flash (mma.sync)") << "head_dim " << D;
    EXPECT_STREQ(mma->name(), "flash (mma.sync)") << "head_dim " << D;
  }
}

TEST(CudaAttention, RejectsUnsupportedArguments) {
  KVS_REQUIRE_GPU();
  DeviceBuffer<bf16> buf(4096);
  DeviceBuffer<float> lse(256);
  bf16* p = buf.get();
  // head_dim 48 is not instantiated
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 96, p, p, 96, 1, 8, 2, 2, 48, nullptr), kvs::Error);
  // Hq not a multiple of Hkv
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 96, p, p, 64, 1, 8, 3, 2, 32, nullptr), kvs::Error);
  // a row stride that breaks the 16-byte loads
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p, 68, p, p, 64, 1, 8, 2, 2, 32, nullptr), kvs::Error);
  // a misaligned base pointer
  EXPECT_THROW(kc::flash_attention_forward(p, lse.get(), p + 1, 64, p, p, 64, 1, 8, 2, 2, 32, nullptr), kvs::Error);
}

}  // namespace
#endif  // KVS_CUDA
