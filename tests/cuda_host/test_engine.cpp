// The CUDA engine built for the host (tests/cuda_host: every kernel under the
// SIMT emulator with its launch's grid and block, cuBLASLt answered by the
// host GEMM, the shim's contract checks on every access) against the CPU
// engine on the same bf16-valued weights: logits, loss and every parameter
// gradient, q/k/v_shift included, for the variants of tests/model/engine_variants.h
// with the GPU test's tolerances (tests/model/test_cuda_engine.cpp); and recomputation
// none / attention / full giving bit-identical gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "hostcuda.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/cuda_engine.h"
#include "model/engine_ranges.h"
#include "model/engine_variants.h"
#include "model/params.h"

namespace {

using kvs::ModelConfig;
using kvs::cuda_test::rel_l2;

using kvs::testing_util::model_of;
using Variant = kvs::testing_util::EngineVariant;
const auto& kVariants = kvs::testing_util::kEngineVariants;

class HostCudaEngineVsCpu : public ::testing::TestWithParam<Variant> {};

// The GPU test's tolerances (tests/model/test_cuda_engine.cpp explains them):
// 2% relative L2 on the logits, 1% on the loss, 3% on every gradient tensor
// (of its norm, or of its batch rows' contributions where they cancel) and on
// the gradient norm. B x T = 2 x 37: one partial attention tile, masked
// positions (RandomBatch), every kernel's tail paths.
// Both engines on one batch: logits, loss, every gradient tensor and the norm.
void expect_engines_agree(const ModelConfig& m, const kvs::Batch& batch, int expected_shift_tensors) {
  const int B = batch.B, T = batch.T;
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  kvs::CpuEngine cpu(m, B, T);
  kvs::CudaEngine gpu(m, B, T);
  cpu.write_params(params.data());
  gpu.write_params(params.data());
  const hostcuda::Stats before = hostcuda::stats();

  std::vector<float> lc(static_cast<size_t>(B) * T * m.vocab_size), lg(lc.size());
  cpu.forward(batch, nullptr, nullptr, lc.data());
  gpu.forward(batch, nullptr, nullptr, lg.data());
  EXPECT_LT(rel_l2(lg.data(), lc.data(), lc.size()), 2e-2) << "logits";

  cpu.zero_grad();
  gpu.zero_grad();
  const double scale = 1.0 / 50;
  const double loss_c = cpu.forward_backward(batch, scale);
  const double loss_g = gpu.forward_backward(batch, scale);
  EXPECT_NEAR(loss_g, loss_c, 1e-2 * std::fabs(loss_c)) << "loss";
  std::vector<float> gc(layout.total), gg(layout.total);
  cpu.read_grads(gc.data());
  gpu.read_grads(gg.data());
  int shift_tensors = 0;
  const std::vector<double> scales = kvs::testing_util::gradient_error_scales(m, layout, params, batch, scale, gc);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const kvs::ParamTensor& t = layout.tensors[i];
    EXPECT_LT(kvs::testing_util::l2_error_over(gg.data() + t.offset, gc.data() + t.offset, t.numel, scales[i]), 3e-2)
        << t.name;
    if (t.kind == kvs::ParamKind::Shift) {
      ++shift_tensors;
      EXPECT_GT(rel_l2(gc.data() + t.offset, std::vector<float>(t.numel, 0.0f).data(), t.numel), 0.0)
          << t.name << ": a zero gradient compares nothing";
    }
  }
  EXPECT_EQ(shift_tensors, expected_shift_tensors);
  EXPECT_NEAR(gpu.grad_norm(), cpu.grad_norm(), 3e-2 * cpu.grad_norm());
  // It was the emulator and the host GEMM that computed this.
  const hostcuda::Stats after = hostcuda::stats();
  EXPECT_GT(after.kernels - before.kernels, 20u);
  EXPECT_GT(after.gemms - before.gemms, 8u);
  EXPECT_GT(after.device_accesses - before.device_accesses, 100000u);
}

TEST_P(HostCudaEngineVsCpu, LogitsLossAndEveryGradient) {
  const Variant& v = GetParam();
  const ModelConfig m = model_of(v);
  const kvs::cuda_test::RandomBatch data(m, 2, 37, 11);
  expect_engines_agree(m, data.batch(),
                       v.shift ? m.num_hidden_layers * (int{v.shift_q} + int{v.shift_k} + int{v.shift_v}) : 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, HostCudaEngineVsCpu, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// Document boundaries: "shift" (the shift restarting at each BOS) and
// "shift_and_attention" (attention masked to the query's document too, on the
// flash kernels: mma.sync at head_dim 16, the Hopper ones at 64), q, k and v
// shifted with window 3 (at head_dim 64: shift_d64's window 1), documents
// starting at BOS tokens planted 1 to 6 rows apart, so every window and
// every attention tile straddles starts. The CPU engine is the oracle (its
// kv_shift and attention with doc_start are checked against PyTorch,
// tests/oracle); and each mode must matter here: the CUDA engine one mode
// short is off in the logits by far more than the tolerance (0.02 relative
// L2): without documents 0.41, "shift" against "shift_and_attention" more
// than 0.2 (measured below); with the shift's documents ignored (doc null),
// every shift gradient was 0.3 to 1.2 off.
TEST(HostCudaEngine, DocumentBoundariesMatchTheCpuEngine) {
  using DB = kvs::DocumentBoundaries;
  for (const auto& [mode, short_of] : {std::pair{DB::Shift, DB::None}, std::pair{DB::ShiftAndAttention, DB::Shift}}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const ModelConfig m = kvs::testing_util::documents_model(mode);
    kvs::cuda_test::RandomBatch data(m, 2, 37, 11);
    kvs::testing_util::plant_documents(data.inputs, data.T);
    expect_engines_agree(m, data.batch(), 3);
    // The same batch through the CUDA engine one mode short: other logits.
    const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
    const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
    ModelConfig less = m;
    less.document_boundaries = short_of;
    kvs::CpuEngine cpu(m, data.B, data.T);
    kvs::CudaEngine gpu(less, data.B, data.T);
    cpu.write_params(params.data());
    gpu.write_params(params.data());
    std::vector<float> full(static_cast<size_t>(data.B) * data.T * m.vocab_size), part(full.size());
    cpu.forward(data.batch(), nullptr, nullptr, full.data());
    gpu.forward(data.batch(), nullptr, nullptr, part.data());
    const double off = rel_l2(part.data(), full.data(), full.size());
    std::printf("[ documents ] one mode short: logits %.3g off\n", off);
    EXPECT_GT(off, 0.2) << "the mode changes little here";
  }
  // At head_dim 64 the Hopper kernels run the masks (the shim is a 9.0 device).
  const ModelConfig d64 =
      kvs::testing_util::documents_model(DB::ShiftAndAttention, kvs::testing_util::kEngineVariants[5]);
  ASSERT_EQ(d64.head_dim(), 64);
  kvs::cuda_test::RandomBatch data(d64, 2, 37, 12);
  kvs::testing_util::plant_documents(data.inputs, data.T);
  expect_engines_agree(d64, data.batch(), 2);  // one layer, k and v shifted
}

// The evaluation's per-token outputs of both engines: each argmax names a largest logit of its
// row (the value decides: bf16 logits tie more often), and the GPU's per-token losses follow the
// CPU's. The loss alone cannot see an argmax never computed or taken from another row, and the
// trainer's accuracy is made of them.
TEST(HostCudaEngine, ArgmaxAndTokenLossesOfTheForward) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 5);
  const int B = 2, T = 37;
  const kvs::cuda_test::RandomBatch data(m, B, T, 13);
  const kvs::Batch batch = data.batch();
  kvs::CpuEngine cpu(m, B, T);
  kvs::CudaEngine gpu(m, B, T);
  cpu.write_params(params.data());
  gpu.write_params(params.data());
  const size_t N = static_cast<size_t>(B) * T, V = static_cast<size_t>(m.vocab_size);
  std::vector<float> lg(N * V), lc(N * V), tlg(N), tlc(N);
  std::vector<int32_t> amg(N, -1), amc(N, -1);
  gpu.forward(batch, tlg.data(), amg.data(), lg.data());
  cpu.forward(batch, tlc.data(), amc.data(), lc.data());
  int scored = 0;
  for (size_t i = 0; i < N; ++i) {
    if (batch.mask[i] == 0.0f) continue;
    ++scored;
    for (const auto& [am, logits, engine] : {std::tuple{&amg, &lg, "GPU"}, std::tuple{&amc, &lc, "CPU"}}) {
      const float* row = logits->data() + i * V;
      const int32_t a = (*am)[i];
      ASSERT_TRUE(a >= 0 && static_cast<size_t>(a) < V) << engine << " argmax " << a << " at position " << i;
      EXPECT_EQ(row[a], *std::max_element(row, row + V)) << engine << " argmax at position " << i;
    }
    EXPECT_NEAR(tlg[i], tlc[i], 5e-2 * std::max(1.0f, std::fabs(tlc[i]))) << "token loss at position " << i;
  }
  EXPECT_GT(scored, N / 2);
}

// Micro-batches smaller than the engine was planned for (the last one of an
// evaluation, a shorter sequence): the plan's per-layer strides are the
// largest micro-batch's, the kernels see the small one. And a forward
// without targets gives the same logits.
TEST(HostCudaEngine, SmallerMicroBatchesThanPlannedMatchTheCpuEngine) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 9);
  kvs::CudaEngine gpu(m, 3, 48);
  gpu.write_params(params.data());
  for (const auto& [B, T] : {std::pair{2, 37}, std::pair{3, 17}, std::pair{1, 48}}) {
    SCOPED_TRACE(std::to_string(B) + " x " + std::to_string(T));
    const kvs::cuda_test::RandomBatch data(m, B, T, 13);
    kvs::CpuEngine cpu(m, B, T);
    cpu.write_params(params.data());
    cpu.zero_grad();
    gpu.zero_grad();
    const double loss_c = cpu.forward_backward(data.batch(), 0.1);
    const double loss_g = gpu.forward_backward(data.batch(), 0.1);
    EXPECT_NEAR(loss_g, loss_c, 1e-2 * std::fabs(loss_c)) << "loss";
    std::vector<float> gc(layout.total), gg(layout.total);
    cpu.read_grads(gc.data());
    gpu.read_grads(gg.data());
    for (const kvs::ParamTensor& t : layout.tensors)
      EXPECT_LT(rel_l2(gg.data() + t.offset, gc.data() + t.offset, t.numel), 3e-2) << t.name;
    std::vector<float> with_targets(static_cast<size_t>(B) * T * m.vocab_size), without(with_targets.size());
    gpu.forward(data.batch(), nullptr, nullptr, with_targets.data());
    kvs::Batch inputs_only = data.batch();
    inputs_only.targets = nullptr;
    inputs_only.mask = nullptr;
    EXPECT_EQ(gpu.forward(inputs_only, nullptr, nullptr, without.data()), 0.0);
    EXPECT_TRUE(without == with_targets);
  }
}

// Recomputation reruns the same deterministic kernels from the same stored
// inputs: the loss and every gradient are bit-identical to keeping everything.
// Three layers (the last one is not recomputed), the sigmoid gate (its
// effective coefficients are reused, not recomputed).
TEST(HostCudaEngine, RecomputationGivesBitIdenticalGradients) {
  const Variant& v = kvs::testing_util::kRecomputeVariant;
  const ModelConfig m = model_of(v);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  std::vector<float> params(layout.total);
  kvs::init_params(layout, m, 5, params.data());
  const int B = 2, T = 40;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = (i * 13 + 5) % m.vocab_size;
    tg[i] = (i * 7 + 3) % m.vocab_size;
  }
  const kvs::Batch b{B, T, in.data(), tg.data(), nullptr};
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (kvs::Recompute level : {kvs::Recompute::None, kvs::Recompute::Attention, kvs::Recompute::Full}) {
    kvs::CudaEngine e(m, B, T, 0, level);
    e.write_params(params.data());
    e.zero_grad();
    losses.push_back(e.forward_backward(b, 0.01));
    grads.emplace_back(layout.total);
    e.read_grads(grads.back().data());
  }
  for (size_t i = 1; i < grads.size(); ++i) {
    EXPECT_EQ(losses[i], losses[0]) << "level " << i;
    EXPECT_TRUE(grads[i] == grads[0]) << "level " << i;
  }
}

}  // namespace

namespace {

// ZeRO-1 on the device: the AdamW moments and the fp32 master are allocated
// on first use, for the range kept by then, so a rank that keeps a shard
// never holds the full moments (they used to be allocated in the constructor
// and freed by keep_optimizer_range: the peak was weights + activations + all
// moments), nor with keep_master_range the full master (beside it, whole fp32
// copies of the norm gains and shift coefficients). The shim counts every
// byte allocated.
TEST(HostCudaEngine, MomentsAreAllocatedForTheKeptRangeOnly) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  const kvs::cuda_test::RandomBatch data(m, 2, 16, 11);
  const size_t n = layout.total, moments = 2 * n * sizeof(float);
  const size_t before = hostcuda::device_bytes_in_use();
  kvs::CudaEngine sharded(m, 2, 16);
  const size_t engine_bytes = hostcuda::device_bytes_in_use() - before;
  const size_t begin = n / 3, end = 2 * n / 3, master = n * sizeof(float);
  sharded.keep_optimizer_range(begin, end);
  EXPECT_EQ(hostcuda::device_bytes_in_use() - before, engine_bytes) << "keep_optimizer_range allocated";
  sharded.write_params(params.data());
  EXPECT_EQ(hostcuda::device_bytes_in_use() - before, engine_bytes + master) << "the master, at the first write";
  sharded.zero_grad();
  sharded.forward_backward(data.batch(), 1.0 / 32);
  kvs::AdamWHyper h;
  h.step = 1;
  sharded.adamw_step_range(h, begin, end);
  EXPECT_EQ(hostcuda::device_bytes_in_use() - before, engine_bytes + master + 2 * (end - begin) * sizeof(float));
  EXPECT_LT(engine_bytes + 2 * (end - begin) * sizeof(float), engine_bytes + moments);

  // The master sharded too, before the first write: its shard and the fp32 copies only.
  size_t copies = 0;
  for (const kvs::ParamTensor& t : layout.tensors)
    if (t.kind == kvs::ParamKind::Norm || t.kind == kvs::ParamKind::Shift) copies += t.numel;
  ASSERT_GT(copies, 0u);
  const size_t before_master = hostcuda::device_bytes_in_use();
  {
    kvs::CudaEngine both(m, 2, 16);
    both.keep_optimizer_range(begin, end);
    both.keep_master_range(begin, end);
    const size_t kept = engine_bytes + (end - begin + copies) * sizeof(float);
    EXPECT_EQ(hostcuda::device_bytes_in_use() - before_master, kept);
    both.write_params(params.data());
    both.zero_grad();
    both.forward_backward(data.batch(), 1.0 / 32);
    both.adamw_step_range(h, begin, end);
    EXPECT_EQ(hostcuda::device_bytes_in_use() - before_master, kept + 2 * (end - begin) * sizeof(float));
  }

  // Without a shard: all of them, on the first step or when reserved.
  const size_t before_whole = hostcuda::device_bytes_in_use();
  {
    kvs::CudaEngine whole(m, 2, 16);
    EXPECT_EQ(hostcuda::device_bytes_in_use() - before_whole, engine_bytes);
    whole.reserve_optimizer_state();
    EXPECT_EQ(hostcuda::device_bytes_in_use() - before_whole, engine_bytes + moments);
    std::vector<float> mo(n, 1.0f), vo(n, 1.0f);
    whole.read_optimizer_state(mo.data(), vo.data());
    EXPECT_TRUE(std::all_of(mo.begin(), mo.end(), [](float x) { return x == 0.0f; })) << "zeroed moments";
  }
  // Read before any step: zeros, nothing allocated.
  kvs::CudaEngine fresh(m, 2, 16);
  const size_t fresh_bytes = hostcuda::device_bytes_in_use();
  std::vector<float> mo(n, 1.0f), vo(n, 1.0f);
  fresh.read_optimizer_state(mo.data(), vo.data());
  EXPECT_TRUE(std::all_of(vo.begin(), vo.end(), [](float x) { return x == 0.0f; }));
  EXPECT_EQ(hostcuda::device_bytes_in_use(), fresh_bytes);
}

// The overlapped AdamW (train.overlap_optimizer, CudaEngine::join_optimizer)
// in the shim's queue, where an operation runs only when something waits for
// it: adamw_step leaves its four updates (the embedding's, each of the two
// layers', the head's) in flight; the first layer's forward waits for the
// embedding's and its own only; a parameter read for all. The update in
// order leaves nothing. (The same bits either way: test_cuda_engine.cpp.)
TEST(HostCudaEngine, TheOverlappedUpdateIsWaitedForRangeByRange) {
  const ModelConfig m = model_of(kVariants[1]);  // 2 layers
  ASSERT_EQ(m.num_hidden_layers, 2);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  const int B = 2, T = 16;
  const kvs::cuda_test::RandomBatch data(m, B, T, 11);
  kvs::CudaEngine e(m, B, T);
  e.write_params(params.data());
  kvs::AdamWHyper h;
  h.lr = 1e-3;
  auto step = [&] {
    e.zero_grad();
    e.forward_backward(data.batch(), 1.0 / (B * T));
    e.grad_norm();
    ++h.step;
    e.adamw_step(h);
  };
  ASSERT_EQ(hostcuda::queued_ops("adamw_kernel"), 0u);
  step();
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 4u) << "adamw_step waited for its update";
  e.forward_layer(0, B, T);
  ASSERT_EQ(cudaStreamSynchronize(e.stream()), cudaSuccess);
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 2u) << "layer 0's forward: the embedding's and layer 0's update";
  std::vector<float> p(layout.total);
  e.read_params(p.data());
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 0u) << "a parameter read waits for the whole update";
  step();
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 4u);
  e.forward_backward(data.batch(), 1.0 / (B * T));  // the next step's forward waits for all of it
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 0u);
  e.set_overlap_optimizer(false);
  step();
  EXPECT_EQ(hostcuda::queued_ops("adamw_kernel"), 0u) << "the update in order";
}

// The ranged copies (a checkpoint moves a tensor or a window at a time): the
// bf16 weights follow a piecewise write, and the moments the kept range.
TEST(HostCudaEngine, RangedHostCopiesAreTheWholeOnesPieceByPiece) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::cuda_test::RandomBatch data(m, 2, 16, 11);
  kvs::testing_util::check_range_copies([&] { return std::make_unique<kvs::CudaEngine>(m, 2, 16); }, data.batch());
}

}  // namespace

namespace {

// train.time_gemm_algorithms on the host build, whose cuBLASLt offers three
// algorithms per shape that all compute the same product: the engine times
// every shape of its first step once, and the steps after it give the
// untimed engine's bits (so the timing wrote none of the engine's buffers
// and every GEMM still runs).
TEST(HostCudaEngine, TimedGemmAlgorithmsAreChosenOnceAndChangeNoResult) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  const int B = 2, T = 16;
  const kvs::cuda_test::RandomBatch data(m, B, T, 11);
  kvs::CudaEngine timed(m, B, T), plain(m, B, T);
  timed.set_time_gemm_algorithms(true);
  std::vector<double> losses[2];
  std::vector<float> params_after[2];
  int i = 0;
  for (kvs::CudaEngine* e : {&timed, &plain}) {
    e->write_params(params.data());
    kvs::AdamWHyper h;
    h.lr = 1e-3;
    for (int step = 1; step <= 3; ++step) {
      e->zero_grad();
      losses[i].push_back(e->forward_backward(data.batch(), 1.0 / (B * T)));
      e->grad_norm();
      h.step = step;
      e->adamw_step(h);
      const std::string line = e->time_gemm_algorithms();
      if (e == &plain || step > 1) {
        EXPECT_EQ(line, "") << "step " << step << (e == &plain ? " (untimed engine)" : "");
        continue;
      }
      // Layer GEMMs (qkv, o, gate/up, down: forward, input and weight gradients) and the head's.
      EXPECT_NE(line.find("GEMM algorithms timed for "), std::string::npos) << line;
      EXPECT_NE(line.find("up to 3 candidates each"), std::string::npos) << line;
    }
    params_after[i].resize(layout.total);
    e->read_params(params_after[i].data());
    ++i;
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(params_after[0] == params_after[1]);
}

// A candidate that cuBLASLt offers and then refuses to run is left out of
// the timing, not an error (Matmul::time_results): the step goes on, the
// shapes are chosen among the two that ran, and no result changes.
TEST(HostCudaEngine, TimedGemmAlgorithmsLeaveOutACandidateThatRefusesToRun) {
  const ModelConfig m = model_of(kVariants[1]);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  const int B = 2, T = 16;
  const kvs::cuda_test::RandomBatch data(m, B, T, 11);
  struct Refused {
    Refused() { hostcuda::refuse_gemm_algorithm(2); }
    ~Refused() { hostcuda::refuse_gemm_algorithm(-1); }
  } refused;
  kvs::CudaEngine timed(m, B, T), plain(m, B, T);
  timed.set_time_gemm_algorithms(true);
  double loss[2];
  std::vector<float> after[2];
  int i = 0;
  for (kvs::CudaEngine* e : {&timed, &plain}) {
    e->write_params(params.data());
    kvs::AdamWHyper h;
    h.lr = 1e-3;
    for (int step = 1; step <= 2; ++step) {
      e->zero_grad();
      loss[i] = e->forward_backward(data.batch(), 1.0 / (B * T));
      e->grad_norm();
      h.step = step;
      e->adamw_step(h);
      const std::string line = e->time_gemm_algorithms();
      if (e == &timed && step == 1) {
        EXPECT_NE(line.find("(up to 2 candidates each)"), std::string::npos) << line;
      }
    }
    after[i].resize(layout.total);
    e->read_params(after[i].data());
    ++i;
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_TRUE(after[0] == after[1]);
}

}  // namespace
