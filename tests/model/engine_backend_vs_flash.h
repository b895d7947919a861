// Helpers of the CUDA engine's tests: an attention backend against the default one.
#pragma once
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "model/config.h"
#include "model/cpu_engine.h"
#include "model/cuda_engine.h"
#include "model/engine_variants.h"
#include "model/params.h"

namespace kvs::testing_util {

// The whole model with attention backend `impl` ("cudnn"; "flash" where it
// runs the Hopper kernels) against `reference` ("flash-mma": our mma.sync
// kernels) and against the CPU engine (the oracle) on the same weights and
// batch. Engines are built
// for T = 64 and run at T = 37 (a second plan). Tolerances: the CUDA-vs-CPU
// engine test's (2% relative L2 on the logits, 1% on the loss, 3% per
// gradient tensor of its norm, or of its batch rows' contributions where they
// cancel, or of the root-sum-square of a shift coefficient's terms:
// gradient_error_scales in tests/model/engine_variants.h); an indexing,
// scaling or masking error is O(1). The cancellation matters here: gqa4-d64's
// layer-0 v_shift gradient is 16% of its rows' contributions, so on the first
// GPU run (H200) cuDNN and flash, each within 0.4-0.8% of those contributions,
// differed by 4.8% of the cancelled sum; on the H100 run the layer-1 v_shift
// of cuDNN and of the Hopper kernels was 5.1% and 3.9% of its rows'
// contributions from the CPU engine's, about 1.8% and 1.4% of its terms'
// root-sum-square.
inline void expect_engine_backend_matches(kvs::AttentionImpl impl, kvs::AttentionImpl reference) {
  struct V {
    const char* name;
    int hidden, heads, kv_heads;
  };
  for (const V& v : {V{"gqa-d64", 128, 2, 1}, V{"mha-d128", 256, 2, 2}, V{"gqa4-d64", 256, 4, 1}}) {
    SCOPED_TRACE(v.name);
    nlohmann::json j = {
        {"name", v.name},
        {"device", "cuda"},
        {"model",
         {{"hidden_size", v.hidden},
          {"intermediate_size", 2 * v.hidden + 8},
          {"num_hidden_layers", 2},
          {"num_attention_heads", v.heads},
          {"num_key_value_heads", v.kv_heads},
          {"vocab_size", 96},
          {"max_position_embeddings", 64},
          {"kv_shift", {{"enabled", true}}}}},
        {"data", {{"type", "induction"}, {"induction", {{"token_lo", 2}, {"token_hi", 96}, {"pool_size", 8}}}}},
        {"train", {{"seq_len", 64}, {"attention_backend", std::string(kvs::to_string(impl))}}}};
    kvs::Config c = kvs::config_from_json(j, v.name);
    kvs::validate(c, v.name);
    const kvs::ModelConfig& m = c.model;
    const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
    const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
    const int B = 3, T = 37;
    const kvs::cuda_test::RandomBatch data(m, B, T, 11);
    const kvs::Batch batch = data.batch();
    kvs::CudaEngine flash(m, B, 64, 0, kvs::Recompute::None, reference);
    kvs::CudaEngine other(m, B, 64, 0, kvs::Recompute::None, impl);
    flash.write_params(params.data());
    other.write_params(params.data());

    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> lf(static_cast<size_t>(B) * T * m.vocab_size, nan), lc(lf.size(), nan);
    flash.forward(batch, nullptr, nullptr, lf.data());
    other.forward(batch, nullptr, nullptr, lc.data());
    EXPECT_LT(kvs::cuda_test::rel_l2(lc.data(), lf.data(), lf.size()), 2e-2) << "logits";  // NaN fails: NaN < x is false

    flash.zero_grad();
    other.zero_grad();
    const double scale = 1.0 / 50;
    const double loss_f = flash.forward_backward(batch, scale);
    const double loss_c = other.forward_backward(batch, scale);
    EXPECT_NEAR(loss_c, loss_f, 1e-2 * std::fabs(loss_f)) << "loss";
    std::vector<float> gf(layout.total, nan), gc(layout.total, nan), gcpu(layout.total);
    flash.read_grads(gf.data());
    other.read_grads(gc.data());
    kvs::CpuEngine cpu(m, B, T);
    cpu.write_params(params.data());
    cpu.zero_grad();
    const double loss_cpu = cpu.forward_backward(batch, scale);
    EXPECT_NEAR(loss_c, loss_cpu, 1e-2 * std::fabs(loss_cpu)) << "loss against the CPU engine";
    cpu.read_grads(gcpu.data());
    const std::vector<double> scales =
        kvs::testing_util::gradient_error_scales(m, layout, params, batch, scale, gcpu);
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      const kvs::ParamTensor& t = layout.tensors[i];
      using kvs::testing_util::l2_error_over;
      EXPECT_LT(l2_error_over(gc.data() + t.offset, gf.data() + t.offset, t.numel, scales[i]), 3e-2) << t.name;
      EXPECT_LT(l2_error_over(gc.data() + t.offset, gcpu.data() + t.offset, t.numel, scales[i]), 3e-2)
          << t.name << " against the CPU engine";
    }
  }
}

}  // namespace kvs::testing_util
#endif  // KVS_CUDA
