// The CUDA engine against the CPU engine (the oracle) on the same weights:
// logits, loss and every gradient (k_shift / v_shift / q_shift included),
// vanilla and shifted, MHA and GQA, tied and untied; then training: 50 steps
// on CUDA follow the CPU loss curve, two CUDA runs are bit-identical, and
// resume on CUDA is bit-identical. Skipped without a GPU.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"
#include "kernels/cuda/ops.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/cuda_engine.h"
#include "model/engine_backend_vs_flash.h"
#include "model/engine_variants.h"
#include "model/params.h"
#include "train/trainer.h"

namespace {

using kvs::cuda_test::rel_l2;

using kvs::ModelConfig;

using kvs::testing_util::gradient_error_scales;
using kvs::testing_util::l2_error_over;
using kvs::testing_util::model_of;
using Variant = kvs::testing_util::EngineVariant;
const auto& kVariants = kvs::testing_util::kEngineVariants;
const Variant kRecompute = kvs::testing_util::kRecomputeVariant;
const Variant kClamp{"clamp", 64, 4, 2, 1, true, false, 1, false, "clamp01", "rope"};

}  // namespace

// Runs without a GPU: every configuration the GPU tests use is a valid config
// (so a first GPU run fails on the engine, not on the test's own set-up).
TEST(CudaEngine, TestConfigurationsAreValid) {
  for (const Variant& v : kVariants) EXPECT_NO_THROW(model_of(v)) << v.name;
  for (const Variant& v : {kRecompute, kClamp}) EXPECT_NO_THROW(model_of(v)) << v.name;
}

// Tolerances: the CUDA engine stores activations in bf16 (8 significant bits,
// relative rounding 2^-9 = 0.2%) and accumulates in fp32; the weights given to
// both engines are already bf16 values, so only activation rounding differs.
// Through a few layers that gives about 0.5-1% relative error per tensor; 3%
// on the relative L2 error of each gradient tensor and 1% on the loss catch
// any real mistake (a wrong index or a missing term is O(1)). A tensor whose
// batch rows' gradients cancel is measured against the rows' contributions,
// and a shift coefficient's also against its terms' root-sum-square
// (gradient_error_scales): on the host build at B = 3, layer 1's v_shift of
// shift_gqa_tied_d32 is 9.5% of its cancelled sum and 0.6% of those.
// The last cases: document boundaries ("shift", "shift_and_attention", and the
// latter at head_dim 64) with BOS planted in the batch
// (engine_variants.h's documents_model; tests/cuda_host has the control that
// the documents matter there).
TEST(CudaEngine, MatchesTheCpuEngineOnLogitsLossAndEveryGradient) {
  KVS_REQUIRE_GPU();
  const int B = 3, T = 37;
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (const Variant& v : kVariants) models.push_back({v.name, model_of(v)});
  models.push_back({"documents", kvs::testing_util::documents_model()});
  models.push_back({"documents_attention",
                    kvs::testing_util::documents_model(kvs::DocumentBoundaries::ShiftAndAttention)});
  models.push_back({"documents_attention_d64",  // the Hopper kernels' masks on a 9.0 GPU
                    kvs::testing_util::documents_model(kvs::DocumentBoundaries::ShiftAndAttention,
                                                       kvs::testing_util::kEngineVariants[5])});
  for (const auto& [name, m] : models) {
    SCOPED_TRACE(name);
    const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
    const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
    kvs::cuda_test::RandomBatch data(m, B, T, 11);
    if (m.document_boundaries != kvs::DocumentBoundaries::None) kvs::testing_util::plant_documents(data.inputs, T);
    const kvs::Batch batch = data.batch();
    kvs::CpuEngine cpu(m, B, T);
    kvs::CudaEngine gpu(m, B, T);
    cpu.write_params(params.data());
    gpu.write_params(params.data());

    std::vector<float> lc(B * T * m.vocab_size), lg(lc.size());
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
    // 3% of each tensor's norm, or of its batch rows' contributions where they
    // cancel (gradient_error_scales explains).
    const std::vector<double> scales = gradient_error_scales(m, layout, params, batch, scale, gc);
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      const kvs::ParamTensor& t = layout.tensors[i];
      EXPECT_LT(l2_error_over(gg.data() + t.offset, gc.data() + t.offset, t.numel, scales[i]), 3e-2) << t.name;
    }
    EXPECT_NEAR(gpu.grad_norm(), cpu.grad_norm(), 3e-2 * cpu.grad_norm());
  }
}

// The engine on the Hopper attention kernels (train.attention_backend
// "flash" where this build and GPU have them) against "flash-mma" (the
// mma.sync kernels) and the CPU engine (tests/model/engine_backend_vs_flash.h
// has the tolerances). Elsewhere "flash" is "flash-mma": nothing to compare.
TEST(CudaEngine, FlashOnTheHopperKernelsMatchesFlashMmaAndTheCpuEngine) {
  KVS_REQUIRE_GPU();
  if (!kvs::cuda::flash_hopper_available(64) || !kvs::cuda::flash_hopper_available(128))
    GTEST_SKIP() << "skipped: no Hopper kernels here (an sm_90a build on a compute capability 9.0 GPU)";
  kvs::testing_util::expect_engine_backend_matches(kvs::AttentionImpl::Flash, kvs::AttentionImpl::FlashMma);
}

// Recomputation recomputes with the same deterministic kernels from the same
// stored inputs, so the loss and every gradient must be bit-identical to the
// run that kept everything.
TEST(CudaEngine, RecomputationGivesBitIdenticalGradients) {
  KVS_REQUIRE_GPU();
  const ModelConfig m = model_of(kRecompute);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  std::vector<float> params(layout.total);
  kvs::init_params(layout, m, 5, params.data());
  const int B = 2, T = 40;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = (i * 13 + 5) % m.vocab_size;
    tg[i] = (i * 7 + 3) % m.vocab_size;
  }
  kvs::Batch b{B, T, in.data(), tg.data(), nullptr};
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

// zero_grad's memset runs on a stream of its own, overlapping the forward
// (CudaEngine::join_zeroing): whatever reads or writes the gradients after it
// sees zeros first. Right after zero_grad, read_grads and grad_norm give
// zeros; a second step after zero_grad (gradients left from the first) gives
// the first step's gradients bit for bit, and two backwards after one
// zero_grad twice the first step's.
// (On the host build the shim also stops any op that touches the gradients
// unordered with the memset: a race on a GPU.)
TEST(CudaEngine, ZeroGradOverlapsTheForwardAndIsJoinedBeforeTheGradients) {
  KVS_REQUIRE_GPU();
  const ModelConfig m = model_of(kVariants[1]);  // shift_gqa
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 9);
  const int B = 2, T = 24;
  const kvs::cuda_test::RandomBatch data(m, B, T, 4);
  kvs::CudaEngine e(m, B, T);
  e.write_params(params.data());
  std::vector<float> g0(layout.total, 1.0f), g1(layout.total), g2(layout.total);
  e.zero_grad();
  e.read_grads(g0.data());
  EXPECT_TRUE(std::all_of(g0.begin(), g0.end(), [](float x) { return x == 0.0f; })) << "read_grads after zero_grad";
  EXPECT_EQ(e.grad_norm(), 0.0);
  const double l1 = e.forward_backward(data.batch(), 0.01);
  e.read_grads(g1.data());
  EXPECT_GT(std::sqrt(std::inner_product(g1.begin(), g1.end(), g1.begin(), 0.0)), 0.0);
  e.zero_grad();
  const double l2 = e.forward_backward(data.batch(), 0.01);
  e.read_grads(g2.data());
  EXPECT_EQ(l2, l1);
  EXPECT_TRUE(g2 == g1) << "the second step's gradients after zero_grad";
  e.zero_grad();
  e.zero_grad();  // twice in a row: still one zeroing before the backward
  e.forward_backward(data.batch(), 0.01);
  e.forward_backward(data.batch(), 0.01);
  e.read_grads(g2.data());
  for (size_t i = 0; i < g1.size(); ++i) g1[i] *= 2.0f;
  // Not bit for bit: a GEMM may add its input C before rounding (cuBLASLt's beta = 1).
  EXPECT_LT(rel_l2(g2.data(), g1.data(), g1.size()), 1e-5) << "two accumulated backwards";
}

// train.overlap_optimizer: adamw_step returns with the update still running
// on a stream of its own, and the next forward waits for each layer's
// parameters just before it reads them (CudaEngine::join_optimizer). Four
// steps give the losses, parameters and moments of the update in order bit
// for bit: one followed by the next step at once (zero_grad's memset after
// the update, which reads the gradients), then an evaluation forward, a
// parameter read, and a moments read and write, each right after an update.
// (On the host build the shim also stops any access to the parameters,
// moments or gradients unordered with the update: a race on a GPU.)
TEST(CudaEngine, OverlappedAdamWGivesTheBitsOfTheUpdateInOrder) {
  KVS_REQUIRE_GPU();
  const ModelConfig m = model_of(kVariants[1]);  // shift_gqa
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 5);
  const int B = 2, T = 24;
  const kvs::cuda_test::RandomBatch data(m, B, T, 6);
  kvs::CudaEngine in_order(m, B, T), overlapped(m, B, T);
  in_order.set_overlap_optimizer(false);
  kvs::CudaEngine* engines[2] = {&in_order, &overlapped};
  std::vector<double> losses[2];
  std::vector<float> after_step3[2], moments[2][2];
  for (int k = 0; k < 2; ++k) {
    kvs::CudaEngine& e = *engines[k];
    e.write_params(params.data());
    for (int step = 1; step <= 4; ++step) {
      e.zero_grad();
      losses[k].push_back(e.forward_backward(data.batch(), 1.0 / (B * T)));
      const double gn = e.grad_norm();
      e.adamw_step({1e-2, 0.9, 0.95, 1e-8, 0.1, step, gn > 1.0 ? 1.0 / gn : 1.0});
      if (step == 2) {  // an evaluation right after the update
        losses[k].push_back(e.forward(data.batch(), nullptr, nullptr, nullptr));
      } else if (step == 3) {
        after_step3[k].resize(layout.total);
        e.read_params(after_step3[k].data());
      } else if (step == 4) {
        std::vector<float> mo(layout.total), v(layout.total);
        e.read_optimizer_state(mo.data(), v.data());
        e.write_optimizer_state(mo.data(), v.data());
      }
    }
    moments[k][0].resize(layout.total);
    moments[k][1].resize(layout.total);
    e.read_optimizer_state(moments[k][0].data(), moments[k][1].data());
  }
  ASSERT_EQ(losses[1].size(), losses[0].size());
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_EQ(losses[1][i], losses[0][i]) << "loss " << i;
  EXPECT_TRUE(after_step3[1] == after_step3[0]) << "the parameters read right after step 3's update";
  EXPECT_FALSE(after_step3[0] == params) << "the updates changed nothing";
  std::vector<float> final_params[2];
  for (int k = 0; k < 2; ++k) {
    final_params[k].resize(layout.total);
    engines[k]->read_params(final_params[k].data());
  }
  EXPECT_TRUE(final_params[1] == final_params[0]) << "the parameters after 4 steps";
  EXPECT_TRUE(moments[1][0] == moments[0][0]) << "exp_avg";
  EXPECT_TRUE(moments[1][1] == moments[0][1]) << "exp_avg_sq";
}

TEST(CudaEngine, AdamWStepMatchesTheCpuEngine) {
  KVS_REQUIRE_GPU();
  const ModelConfig m = model_of(kClamp);
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  std::vector<float> params(layout.total);
  kvs::init_params(layout, m, 3, params.data());
  kvs::CpuEngine cpu(m, 1, 8);
  kvs::CudaEngine gpu(m, 1, 8);
  cpu.write_params(params.data());
  gpu.write_params(params.data());
  std::vector<int32_t> in(8), tg(8);
  for (int i = 0; i < 8; ++i) {
    in[i] = (i * 7) % m.vocab_size;
    tg[i] = (i * 5 + 1) % m.vocab_size;
  }
  kvs::Batch b{1, 8, in.data(), tg.data(), nullptr};
  const double loss_before = cpu.forward(b, nullptr, nullptr, nullptr);
  // Three steps of backward + AdamW (clamp01 shift coefficients, decay on
  // matrices). The CPU engine's optimizer is given the CUDA engine's gradient
  // each step, so both apply AdamW to the same numbers: the CUDA kernel rounds
  // each operation as the CPU loop writes it, so the parameters agree to a few
  // ulps, while a wrong decay flag, bias correction, moment, chunk or clamp
  // moves an element by O(lr) = 1e-2. (With each engine's own gradient the
  // comparison was only as good as bf16 noise: a shift coefficient's gradient
  // is a cancelling sum, and after one step the engines' weights drift apart.)
  // Step 2 scales the gradient by 0.5 (global-norm clipping): Adam undoes a
  // scale applied to every step, not one applied to a single step. β1, β2 and
  // eps are not the defaults (eps 1e-3 is of the size of sqrt(v̂) here), so an
  // engine that passed the kernel its own constants would fail.
  std::vector<float> grads(layout.total);
  for (int step = 1; step <= 3; ++step) {
    gpu.zero_grad();
    gpu.forward_backward(b, 0.125);
    gpu.read_grads(grads.data());
    std::copy(grads.begin(), grads.end(), cpu.host_grads());
    kvs::AdamWHyper h;
    h.lr = 1e-2;
    h.beta1 = 0.8;
    h.beta2 = 0.99;
    h.eps = 1e-3;
    h.weight_decay = 0.1;
    h.step = step;
    h.grad_scale = step == 2 ? 0.5 : 1.0;
    cpu.adamw_step(h);
    gpu.adamw_step(h);
  }
  std::vector<float> pc(layout.total), pg(layout.total);
  cpu.read_params(pc.data());
  gpu.read_params(pg.data());
  for (const kvs::ParamTensor& t : layout.tensors) {
    size_t bad = 0, moved = 0, first_bad = t.numel;
    for (size_t i = 0; i < t.numel; ++i) {
      const size_t k = t.offset + i;
      // A few ulps of the parameter plus 1e-4 of one step's update.
      if (!(std::fabs(pg[k] - pc[k]) <= 5e-7f * std::fabs(pc[k]) + 1e-6f) && bad++ == 0) first_bad = i;
      moved += pc[k] != params[k];
    }
    EXPECT_EQ(bad, 0u) << t.name << ": " << bad << " of " << t.numel << " parameters differ, first element "
                       << first_bad;
    EXPECT_EQ(moved, t.numel) << t.name << ": AdamW left parameters where they were";
    if (t.kind == kvs::ParamKind::Shift)
      for (size_t i = 0; i < t.numel; ++i) {
        EXPECT_GE(pg[t.offset + i], 0.0f) << t.name;
        EXPECT_LE(pg[t.offset + i], 1.0f) << t.name;
      }
  }
  // The CUDA engine computes from a bf16 copy of its parameters, refreshed by
  // the AdamW kernel: a stale copy would leave its loss at the starting one.
  const double loss_cpu = cpu.forward(b, nullptr, nullptr, nullptr);
  const double loss_gpu = gpu.forward(b, nullptr, nullptr, nullptr);
  EXPECT_GT(std::fabs(loss_before - loss_cpu), 1e-2 * std::fabs(loss_before)) << "the steps did not move the loss";
  EXPECT_LT(std::fabs(loss_gpu - loss_cpu), 0.1 * std::fabs(loss_before - loss_cpu))
      << "before " << loss_before << ", after: CPU " << loss_cpu << ", CUDA " << loss_gpu;
}

// The decay flags alone, without the CPU engine: with zero gradients AdamW
// moves a parameter only by its weight decay, so decayed tensors go from 1 to
// 1 - lr wd and RMSNorm gains and shift coefficients stay 1.
TEST(CudaEngine, NormsAndShiftsAreNotDecayed) {
  KVS_REQUIRE_GPU();
  const ModelConfig m = model_of(kClamp);
  kvs::CudaEngine e(m, 1, 8);
  const kvs::ParamLayout& L = e.layout();
  std::vector<float> p(L.total, 1.0f);
  e.write_params(p.data());
  e.zero_grad();
  e.adamw_step({0.1, 0.9, 0.95, 1e-8, 0.5, 1, 1.0});
  e.read_params(p.data());
  for (const auto& t : L.tensors)
    for (size_t i = 0; i < t.numel; ++i)
      ASSERT_FLOAT_EQ(p[t.offset + i], t.decay() ? 1.0f - 0.1f * 0.5f : 1.0f) << t.name << " element " << i;
}

namespace {

kvs::Config tiny_training(const char* device, bool shift) {
  nlohmann::json j = {
      {"name", "cuda-tiny"},
      {"device", device},
      {"model",
       {{"hidden_size", 64},
        {"intermediate_size", 128},
        {"num_hidden_layers", 2},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 2},
        {"vocab_size", 64},
        {"max_position_embeddings", 64},
        {"kv_shift", {{"enabled", shift}}}}},
      {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 64}, {"pool_size", 16}}}}},
      {"train",
       {{"seq_len", 32},
        {"micro_batch_size", 8},
        {"grad_accum_steps", 2},
        {"steps", 50},
        {"lr", 3e-3},
        {"warmup_steps", 5},
        {"eval_every", 25},
        {"eval_sequences", 16},
        {"checkpoint_every", 0},
        {"threads", 2}}}};
  kvs::Config c = kvs::config_from_json(j, "cuda-tiny");
  kvs::validate(c, "cuda-tiny");
  return c;
}

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "kvs_cuda_" + name;
  std::filesystem::remove_all(d);
  return d;
}

}  // namespace

// 50 steps from the same initialisation: the bf16 CUDA run stays within 5% of
// the fp32 CPU loss at every step (the curves start identical and drift only
// through rounding; a wrong gradient separates them by far more within 50
// Adam steps), and two CUDA runs are bit-identical.
TEST(CudaEngine, FiftyStepsFollowTheCpuLossCurveAndRepeatBitForBit) {
  KVS_REQUIRE_GPU();
  for (bool shift : {true, false}) {
    SCOPED_TRACE(shift ? "shifted" : "vanilla");
    auto cpu = kvs::train(tiny_training("cpu", shift), {fresh("cpu"), false, true});
    auto a = kvs::train(tiny_training("cuda", shift), {fresh("a"), false, true});
    auto b = kvs::train(tiny_training("cuda", shift), {fresh("b"), false, true});
    ASSERT_EQ(a.losses.size(), cpu.losses.size());
    for (size_t i = 0; i < cpu.losses.size(); ++i)
      EXPECT_NEAR(a.losses[i], cpu.losses[i], 0.05 * cpu.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.final_eval.loss, b.final_eval.loss);
  }
}

TEST(CudaEngine, TrainingTestConfigurationsAreValid) {  // no GPU needed
  for (bool shift : {true, false}) {
    EXPECT_NO_THROW(tiny_training("cpu", shift));
    EXPECT_NO_THROW(tiny_training("cuda", shift));
  }
}

TEST(CudaEngine, ResumeIsBitIdentical) {
  KVS_REQUIRE_GPU();
  kvs::Config c = tiny_training("cuda", true);
  c.train.steps = 20;
  auto full = kvs::train(c, {fresh("full"), false, true});
  const std::string dir = fresh("resumed");
  kvs::Config head = c;
  head.train.steps = 8;
  kvs::train(head, {dir, false, true});
  auto rest = kvs::train(c, {dir, true, true});
  ASSERT_EQ(rest.losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(rest.losses[i], full.losses[8 + i]) << "step " << 9 + i;
  EXPECT_EQ(rest.final_eval.loss, full.final_eval.loss);
}

// Runs without a GPU too: the constructor checks the shape before touching the device.
TEST(CudaEngine, UnsupportedHeadDimIsAClearError) {
  const Variant v{"d8", 16, 2, 2, 1, true, false, 1, false, "free", "rope"};
  const ModelConfig m = model_of(v);
  const std::string err = kvs::testing_util::error_of([&] { kvs::CudaEngine e(m, 1, 8); });
  EXPECT_NE(err.find("head_dim 8"), std::string::npos) << err;
}
#endif  // KVS_CUDA
