// Tensor parallelism on the CUDA engine (docs/PARALLEL.md "Tensor parallel on
// CUDA"): the vocab-parallel loss kernels, with the all-reduces done on the
// host between them, equal the fused single-GPU loss on the whole row; the
// vocab-slice embedding gathers its own rows and zeros; then `mpirun -np 2`
// with tp = 2 on one GPU (MPI backend, activations staged through the host)
// follows the single-process CUDA loss curve, and dp 2 x tp 2 on 4 ranks too.
// Skipped without a GPU; run on an H100 and an H200 (docs/CUDA.md).
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "cuda_test_util.h"
#include "dist_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/vocab_parallel_ce.h"
#include "model/config.h"
#include "parallel/tensor_parallel.h"
#include "train/trainer.h"

using namespace kvs::cuda_test;
using namespace kvs::testing_util;
namespace kc = kvs::cuda;

namespace {

// Rank r's columns of the full [N, Vfull] logits, padded to the local width V.
std::vector<float> slice_columns(const std::vector<float>& full, int N, int Vfull, int v_begin, int V) {
  std::vector<float> out(static_cast<size_t>(N) * V, 0.0f);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V && v_begin + v < Vfull; ++v)
      out[static_cast<size_t>(n) * V + v] = full[static_cast<size_t>(n) * Vfull + v_begin + v];
  return out;
}

nlohmann::json cuda_config(bool shift, int vocab) {
  nlohmann::json j = tiny_cuda_config(shift, 4);  // head_dim 16: the smallest the CUDA attention kernels take
  j["model"]["vocab_size"] = vocab;
  return j;
}

}  // namespace

// The three kernels, with every "all-reduce" done here on the host over two
// ranks' statistics, against the fused loss on the whole row: losses, dlogits
// (padding columns 0) and argmax. Vocabulary 200 over tp = 2 pads to 256:
// rank 0 holds 128 real columns, rank 1 72 and 56 padding. Logits are bf16
// with many ties (coarse values), so the first-index rule for argmax is tested.
TEST(CudaTensorParallel, VocabParallelLossEqualsTheFusedLoss) {
  KVS_REQUIRE_GPU();
  const int N = 37, Vfull = 200, tp = 2;
  // Only the vocabulary matters here; the rest is a valid tp = 2 model
  // (LocalDims::of divides by the head count).
  kvs::ModelConfig m;
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.vocab_size = Vfull;
  std::vector<float> logits = random_bf16_values(static_cast<size_t>(N) * Vfull, 11, 2.0f);
  for (size_t i = 0; i < logits.size(); i += 3) logits[i] = std::round(logits[i]);  // ties
  std::vector<int32_t> targets(N);
  std::vector<float> mask(N, 1.0f);
  for (int n = 0; n < N; ++n) targets[n] = (n * 53 + 7) % Vfull;
  mask[3] = 0.0f;
  mask[20] = 0.5f;
  const float grad_scale = 0.25f;

  // Oracle: the fused kernel on the whole rows.
  DeviceBuffer<bf16> d_full(to_bf16(logits)), d_dfull(static_cast<size_t>(N) * Vfull);
  DeviceBuffer<float> d_loss(N), d_mask(mask);
  DeviceBuffer<int32_t> d_tg(targets), d_arg(N);
  kc::cross_entropy_forward_backward(d_loss.get(), d_dfull.get(), d_arg.get(), d_full.get(), d_tg.get(), d_mask.get(),
                                     N, Vfull, grad_scale, 0);
  const std::vector<float> want_loss = d_loss.download(), want_d = to_f32(d_dfull.download());
  const std::vector<int32_t> want_arg = d_arg.download();

  struct Rank {
    kvs::LocalDims d;
    int valid;
    std::unique_ptr<DeviceBuffer<bf16>> x;
    std::unique_ptr<DeviceBuffer<float>> stats, loss;
    std::unique_ptr<DeviceBuffer<int32_t>> arg;
  };
  std::vector<Rank> ranks(tp);
  for (int r = 0; r < tp; ++r) {
    Rank& k = ranks[r];
    k.d = kvs::LocalDims::of(m, r, tp);
    k.valid = std::clamp(k.d.v_valid - k.d.v_begin, 0, k.d.V);
    // Padding columns hold garbage: the kernels must ignore them and write their dlogits as 0.
    std::vector<float> x = slice_columns(logits, N, Vfull, k.d.v_begin, k.d.V);
    for (int n = 0; n < N; ++n)
      for (int v = k.valid; v < k.d.V; ++v) x[static_cast<size_t>(n) * k.d.V + v] = 30.0f;
    k.x = std::make_unique<DeviceBuffer<bf16>>(to_bf16(x));
    k.stats = std::make_unique<DeviceBuffer<float>>(kc::VocabCeStats::floats(N));
    k.loss = std::make_unique<DeviceBuffer<float>>(N);
    k.arg = std::make_unique<DeviceBuffer<int32_t>>(N);
  }
  ASSERT_EQ(ranks[0].valid, 128);
  ASSERT_EQ(ranks[1].valid, 72);
  // A host "all-reduce" of floats [off, off + n) of every rank's statistics.
  auto all_reduce = [&](size_t off, size_t n, bool max) {
    std::vector<std::vector<float>> h;
    for (Rank& k : ranks) h.push_back(k.stats->download());
    for (size_t i = off; i < off + n; ++i) {
      float acc = h[0][i];
      for (int r = 1; r < tp; ++r) acc = max ? std::max(acc, h[r][i]) : acc + h[r][i];
      for (int r = 0; r < tp; ++r) h[r][i] = acc;
    }
    for (int r = 0; r < tp; ++r) ranks[r].stats->upload(h[r]);
  };
  auto st = [&](Rank& k) { return kc::VocabCeStats::at(k.stats->get(), N); };
  for (Rank& k : ranks)
    kc::vocab_parallel_ce_local(st(k), k.x->get(), d_tg.get(), d_mask.get(), N, k.d.V, k.valid, k.d.v_begin, true, 0);
  all_reduce(0, N, true);
  for (Rank& k : ranks) kc::vocab_parallel_ce_rescale(st(k), d_mask.get(), N, k.d.v_begin, 0);
  all_reduce(2 * static_cast<size_t>(N), 2 * static_cast<size_t>(N), false);
  all_reduce(4 * static_cast<size_t>(N), N, true);
  for (Rank& k : ranks)
    kc::vocab_parallel_ce_finish(k.loss->get(), k.x->get(), k.arg->get(), st(k), k.x->get(), d_tg.get(),
                                 d_mask.get(), N, k.d.V, k.valid, k.d.v_begin, grad_scale, 0);

  for (int r = 0; r < tp; ++r) {
    Rank& k = ranks[r];
    // fp32 sums in another order: a few ulps of the loss.
    EXPECT_TRUE(all_close(k.loss->download(), want_loss, 1e-5, 1e-6)) << "rank " << r;
    EXPECT_EQ(k.arg->download(), want_arg) << "rank " << r;
    const std::vector<float> got = to_f32(k.x->download());
    const std::vector<float> want = slice_columns(want_d, N, Vfull, k.d.v_begin, k.d.V);
    // bf16 outputs of fp32 values that differ in the last fp32 bits: one bf16 ulp.
    EXPECT_TRUE(all_close(got, want, 1.0 / 128, 1e-6)) << "rank " << r << " dlogits";
    for (int n = 0; n < N; ++n)
      for (int v = k.valid; v < k.d.V; ++v) ASSERT_EQ(got[static_cast<size_t>(n) * k.d.V + v], 0.0f) << "padding";
  }
}

// Rows of this rank's slice are gathered; other tokens give zero rows.
TEST(CudaTensorParallel, EmbeddingVocabSliceGathersOwnRowsAndZeros) {
  KVS_REQUIRE_GPU();
  const int N = 9, C = 24, v_begin = 128, V = 128;
  const std::vector<float> wte = random_bf16_values(static_cast<size_t>(V) * C, 5);
  const std::vector<int32_t> tokens = {0, 127, 128, 200, 255, 256, 130, 3, 254};
  DeviceBuffer<bf16> d_wte(to_bf16(wte)), d_out(static_cast<size_t>(N) * C);
  DeviceBuffer<int32_t> d_tok(tokens);
  kc::embedding_forward_vocab_slice(d_out.get(), d_tok.get(), d_wte.get(), N, C, v_begin, V, 0);
  const std::vector<float> got = to_f32(d_out.download());
  for (int n = 0; n < N; ++n) {
    const int row = tokens[n] - v_begin;
    for (int c = 0; c < C; ++c) {
      const float want = row >= 0 && row < V ? wte[static_cast<size_t>(row) * C + c] : 0.0f;
      ASSERT_EQ(got[static_cast<size_t>(n) * C + c], want) << "token " << tokens[n] << " column " << c;
    }
  }
}

// tp = 2 (and dp 2 x tp 2) with the CUDA kernels, every all-reduce staged
// through the host under mpirun, against one process on the same GPU. Not
// bit-identical: a row-parallel matmul's two halves are rounded to bf16 before
// they are summed. 5e-3 relative over 20 steps: on the host build tp = 2 is
// within 4.7e-4 (vanilla), and a planted missing all-reduce of a column-
// parallel input gradient is 1e-2 off at step 2 (lr: tiny_cuda_config).
// The gradient norm drifts further than the loss (test_cuda_zero1.cpp): on an
// H200 (2026-11-29) the losses agreed within 5.1e-4, the norms of steps 15-20
// within 7.2e-3 (vanilla; shifted 1.1e-3); on the host build 5.9e-4 and 7.5e-3
// (shifted 1.6e-3). After step 5 the norm is held to 2e-2.
TEST(CudaTensorParallel, MpiRanksOnOneGpuFollowTheSingleProcessCurve) {
  KVS_REQUIRE_GPU();
  for (bool shift : {true, false}) {
    TmpDir tmp;
    const std::string cfg = tmp / "c.json";
    // 200: both ranks hold real vocabulary columns; 32: rank 1 holds padding only.
    spit(cfg, cuda_config(shift, shift ? 200 : 32).dump());
    train(0, cfg, tmp / "single");
    const Curve ref = read_metrics(tmp / "single");
    ASSERT_EQ(ref.train.size(), 20u);
    const std::string what = shift ? "shifted" : "vanilla";
    train(2, cfg, tmp / "tp2", "--set parallel.tp=2");
    expect_close(read_metrics(tmp / "tp2"), ref, 1, what + " cuda tp=2 (mpi)", 5e-3, 2e-2);
    train(4, cfg, tmp / "dp2tp2", "--set parallel.tp=2");
    expect_close(read_metrics(tmp / "dp2tp2"), ref, 1, what + " cuda dp=2 x tp=2 (mpi)", 5e-3, 2e-2);
  }
}

// No GPU needed: the staged (MPI) all-reduce widens bf16 on the host and
// rounds back with kvs::f32_to_bf16; that rounding must be CUDA's
// __float2bfloat16_rn bit for bit (nearest even, ties, subnormals, overflow to
// inf), or a staged tp = 2 run would drift from an NCCL one. NaN payloads may
// differ; both must stay NaN.
TEST(CudaTensorParallel, HostBf16RoundingIsCudas) {
  size_t checked = 0;
  auto one = [&](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    const uint16_t ours = kvs::f32_to_bf16(f);
    const uint16_t cuda = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(kvs::bf16_to_f32(ours))) << std::hex << u;
    } else {
      ASSERT_EQ(ours, cuda) << "bits 0x" << std::hex << u;
      ASSERT_EQ(kvs::bf16_to_f32(cuda), __bfloat162float(__ushort_as_bfloat16(cuda)));
    }
    ++checked;
  };
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) one(static_cast<uint32_t>(u));  // every exponent, many mantissas
  for (uint32_t hi : {0x3f80u, 0x0000u, 0x0001u, 0x7f7fu, 0x7f80u, 0xff80u, 0x8000u})
    for (uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) one(hi << 16 | lo);  // ties and neighbours
  EXPECT_GT(checked, 1000000u);
}

// No GPU needed: tensor parallelism is a valid layout on device cuda.
TEST(CudaTensorParallel, TpOnCudaIsAValidConfiguration) {
  kvs::Config c = kvs::config_from_json(cuda_config(true, 200), "cuda-tp");
  c.parallel.tp = 2;
  EXPECT_NO_THROW(kvs::validate(c, "cuda-tp"));
  EXPECT_NO_THROW(kvs::check_parallel_layout(c, 4));
}

#endif  // KVS_CUDA
