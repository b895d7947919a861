#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "hostcuda.h"
#include "model/cpu_engine.h"
#include "model/cuda_engine.h"

TEST(HostSmoke, ForwardBackward) {
  kvs::ModelConfig m;
  m.hidden_size = 64;
  m.intermediate_size = 136;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.vocab_size = 96;
  m.max_position_embeddings = 64;
  m.kv_shift.enabled = true;
  const int B = 2, T = 19;
  const kvs::ParamLayout layout = kvs::ParamLayout::build(m);
  const std::vector<float> params = kvs::cuda_test::bf16_params(layout, m, 7);
  const kvs::cuda_test::RandomBatch data(m, B, T, 11);
  kvs::CpuEngine cpu(m, B, T);
  kvs::CudaEngine gpu(m, B, T);
  cpu.write_params(params.data());
  gpu.write_params(params.data());
  cpu.zero_grad();
  gpu.zero_grad();
  const double lc = cpu.forward_backward(data.batch(), 0.02);
  const double lg = gpu.forward_backward(data.batch(), 0.02);
  EXPECT_NEAR(lg, lc, 1e-2 * lc);
  std::vector<float> gc(layout.total), gg(layout.total);
  cpu.read_grads(gc.data());
  gpu.read_grads(gg.data());
  for (const kvs::ParamTensor& t : layout.tensors)
    EXPECT_LT(kvs::cuda_test::rel_l2(gg.data() + t.offset, gc.data() + t.offset, t.numel), 3e-2) << t.name;
  const auto s = hostcuda::stats();
  printf("kernels %lu gemms %lu copies %lu syncs %lu accesses %lu\n", s.kernels, s.gemms, s.copies, s.syncs, s.device_accesses);
}
