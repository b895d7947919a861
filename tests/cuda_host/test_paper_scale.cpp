// The engine's host side at the paper's 1.5B scale (configs/paper/1.5B-kvshift.json,
// micro-batches 4 x 2048 and 8 x 2048), in the shim's launch-only mode: every launch, cuBLASLt
// call and copy of a training step, an evaluation and the optimizer is
// checked as it is issued (grid and block limits, shared memory, GEMM
// layouts, leading dimensions, alignments and ranges inside the plan's
// allocation) without running the kernels, which the emulator could not do at
// this size. What a first GPU run would otherwise be the first to see at scale.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "build_paths.h"
#include "hostcuda.h"
#include "model/config.h"
#include "model/cuda_engine.h"
#include "test_util.h"

namespace {

struct LaunchOnly {
  LaunchOnly() { hostcuda::set_launch_only(true); }
  ~LaunchOnly() { hostcuda::set_launch_only(false); }
};

}  // namespace

TEST(HostCudaLaunchOnly, ThePaper15BStepLaunchesWithinAGpusLimits) {
  LaunchOnly scope;
  const kvs::Config c = kvs::load_config(std::string(kvs::test::source_dir()) + "/configs/paper/1.5B-kvshift.json");
  const int B = 8, T = 2048;
  std::vector<int32_t> in(B * T), tg(B * T);
  std::mt19937 g(3);
  for (int i = 0; i < B * T; ++i) {
    in[i] = static_cast<int32_t>(g() % c.model.vocab_size);
    tg[i] = static_cast<int32_t>(g() % c.model.vocab_size);
  }
  struct Case {
    int B;
    kvs::Recompute level;
  };
  // docs/CUDA.md's table (4 x 2048, every recomputation level) and the
  // largest plan it names (8 x 2048 without recomputation, 62 GiB).
  for (const Case k : {Case{4, kvs::Recompute::None}, Case{4, kvs::Recompute::Attention},
                       Case{4, kvs::Recompute::Full}, Case{8, kvs::Recompute::None}}) {
    SCOPED_TRACE("micro-batch " + std::to_string(k.B) + ", recompute " + std::to_string(static_cast<int>(k.level)));
    const kvs::Batch b{k.B, T, in.data(), tg.data(), nullptr};
    const hostcuda::Stats before = hostcuda::stats();
    kvs::CudaEngine e(c.model, k.B, T, 0, k.level);
    e.zero_grad();
    e.forward_backward(b, 1.0 / 64);
    e.grad_norm();
    kvs::AdamWHyper h;
    h.step = 1;
    e.adamw_step(h);
    std::vector<float> losses(k.B * T);
    std::vector<int32_t> argmax(k.B * T);
    e.forward(b, losses.data(), argmax.data(), nullptr);
    const hostcuda::Stats after = hostcuda::stats();
    EXPECT_GT(after.kernels - before.kernels, 28u * 20);
    EXPECT_GT(after.gemms - before.gemms, 28u * 10);
  }
}

// A plan that does not fit an 80 GB device fails at construction with the
// engine's own message, as on the GPU.
TEST(HostCudaLaunchOnly, APlanAboveTheDeviceMemoryFailsWithItsSize) {
  LaunchOnly scope;
  const kvs::Config c = kvs::load_config(std::string(kvs::test::source_dir()) + "/configs/paper/6.7B-kvshift.json");
  EXPECT_KVS_ERROR(kvs::CudaEngine(c.model, 8, 2048), "cannot allocate the", "GiB this model needs at micro-batch 8 x 2048");
}
