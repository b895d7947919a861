// Pipeline parallelism on the CUDA engine (docs/PARALLEL.md, docs/CUDA.md).
// In one process: two stage engines (pp = 2) chained by hand, two
// micro-batches in flight in two slots, give the whole engine's losses and
// gradients bit for bit, with the activations passed as host fp32 (the MPI
// path) or copied between the engines' own device buffers (what NCCL moves).
// Then `mpirun -np 2` with device cuda on one GPU (MPI backend: activations
// staged through pinned host memory), 1F1B and interleaved, follows the
// single-process CUDA loss curve. Skipped without a GPU; run on an H100 and
// an H200 (docs/CUDA.md). tests/cuda_host/mpi_pipeline.cpp runs the same
// engine on the host.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "dist_test_util.h"
#include "model/config.h"
#include "model/cuda_engine.h"
#include "model/params.h"
#include "parallel/pipeline.h"

using namespace kvs::testing_util;

namespace {

nlohmann::json cuda_config(bool shift, int accum) {  // 4 layers
  nlohmann::json j = tiny_cuda_config(shift, accum);
  j["model"]["num_hidden_layers"] = 4;
  return j;
}

// The stage's parameters (or gradients) written into / read from a full-model flat buffer, by name.
void stage_to_full(const kvs::ParamLayout& stage, const std::vector<float>& s, const kvs::ParamLayout& full,
                   std::vector<float>& f) {
  for (const kvs::ParamTensor& t : stage.tensors) {
    const kvs::ParamTensor* w = full.find(t.name);
    ASSERT_NE(w, nullptr) << t.name;
    std::copy(s.begin() + t.offset, s.begin() + t.offset + t.numel, f.begin() + w->offset);
  }
}
std::vector<float> full_to_stage(const kvs::ParamLayout& full, const std::vector<float>& f,
                                 const kvs::ParamLayout& stage) {
  std::vector<float> s(stage.total);
  for (const kvs::ParamTensor& t : stage.tensors) {
    const kvs::ParamTensor* w = full.find(t.name);
    std::copy(f.begin() + w->offset, f.begin() + w->offset + w->numel, s.begin() + t.offset);
  }
  return s;
}

}  // namespace

TEST(CudaPipeline, StagesChainedInOneProcessEqualTheWholeEngine) {
  KVS_REQUIRE_GPU();
  for (const bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device buffers" : "host fp32");
    const kvs::Config c = validated(cuda_config(true, 1), "cuda-pp");
    const kvs::StageSplit split = kvs::StageSplit::make(c.model, 2, 1, {}, "test");
    const kvs::ModelPart p0 = kvs::ModelPart::of(split, 0), p1 = kvs::ModelPart::of(split, 1);
    kvs::CudaEngine whole(c.model, 2, 16);
    kvs::CudaEngine s0(c.model, 2, 16, 0, kvs::Recompute::None, kvs::AttentionImpl::Flash, {}, {}, &p0, 2);
    kvs::CudaEngine s1(c.model, 2, 16, 0, kvs::Recompute::None, kvs::AttentionImpl::Flash, {}, {}, &p1, 2);
    const kvs::ParamLayout& full = whole.layout();
    std::vector<float> init(full.total);
    kvs::init_params(full, c.model, 7, init.data());
    whole.write_params(init.data());
    s0.write_params(full_to_stage(full, init, s0.layout()).data());
    s1.write_params(full_to_stage(full, init, s1.layout()).data());
    const TinyBatch d[2] = {tiny_batch(7), tiny_batch(5)};
    whole.zero_grad();
    s0.zero_grad();
    s1.zero_grad();
    const double scale = 1.0 / 64;
    double want = 0, got = 0;
    for (const TinyBatch& x : d) want += whole.forward_backward(x.batch(), scale);
    using T = kvs::Engine::StageTensor;
    auto move = [](kvs::Engine& from, int fslot, T ft, kvs::Engine& to, int tslot, T tt, const kvs::Batch& b) {
      const kvs::Engine::DeviceBuffer src = from.stage_device_buffer(fslot, 0, ft, b);
      const kvs::Engine::DeviceBuffer dst = to.stage_device_buffer(tslot, 0, tt, b);
      ASSERT_EQ(src.bytes, dst.bytes);
      ASSERT_EQ(cudaMemcpy(dst.data, src.data, src.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a device-to-device cudaMemcpy does not wait
    };
    // Both forwards first (two slots in flight), then both backwards.
    std::vector<float> act(s0.stage_floats(d[0].batch())), grad(act.size());
    for (int m = 0; m < 2; ++m) {
      const kvs::Batch b = d[m].batch();
      if (on_device) {
        s0.stage_forward(m, 0, b, nullptr, nullptr, scale);
        move(s0, m, T::Output, s1, m, T::Input, b);
        got += s1.stage_forward(m, 0, b, nullptr, nullptr, scale);
      } else {
        s0.stage_forward(m, 0, b, nullptr, act.data(), scale);
        got += s1.stage_forward(m, 0, b, act.data(), nullptr, scale);
      }
    }
    for (int m = 0; m < 2; ++m) {
      const kvs::Batch b = d[m].batch();
      if (on_device) {
        s1.stage_backward(m, 0, nullptr, nullptr);
        move(s1, m, T::GradInput, s0, m, T::GradOutput, b);
        s0.stage_backward(m, 0, nullptr, nullptr);
      } else {
        s1.stage_backward(m, 0, nullptr, grad.data());
        s0.stage_backward(m, 0, grad.data(), nullptr);
      }
    }
    EXPECT_EQ(got, want);
    std::vector<float> gw(full.total), g(full.total, 0.0f), g0(s0.layout().total), g1(s1.layout().total);
    whole.read_grads(gw.data());
    s0.read_grads(g0.data());
    s1.read_grads(g1.data());
    stage_to_full(s0.layout(), g0, full, g);
    stage_to_full(s1.layout(), g1, full, g);
    EXPECT_EQ(g, gw);
    EXPECT_KVS_ERROR(s0.forward_backward(d[0].batch(), scale), "needs the whole model");
  }
}

// Two MPI ranks on one GPU as pipeline stages (activations through pinned
// host memory), against one process with the same global batch. The math is
// the same op for op (the host-built engine gives the same bits,
// tests/cuda_host/mpi_pipeline.cpp); 1e-6 relative leaves room only for a
// library choosing another algorithm in another process.
TEST(CudaPipeline, TwoMpiRanksOnOneGpuFollowTheSingleProcessCurve) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, cuda_config(true, 4).dump());
  train(0, cfg, tmp / "pp1");
  const Curve ref = read_metrics(tmp / "pp1");
  ASSERT_EQ(ref.train.size(), 20u);
  train(2, cfg, tmp / "pp2", "--set parallel.pp=2");
  expect_close(read_metrics(tmp / "pp2"), ref, 1, "cuda pp=2 (mpi)", 1e-6);
  train(2, cfg, tmp / "pp2v2", "--set parallel.pp=2 --set parallel.virtual_stages=2 --set train.recompute=full");
  expect_close(read_metrics(tmp / "pp2v2"), ref, 1, "cuda pp=2 x 2 virtual stages, recompute full (mpi)", 1e-6);
}

#endif  // KVS_CUDA
