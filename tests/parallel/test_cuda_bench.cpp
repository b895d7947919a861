// `kvshift bench --device cuda` in parallel layouts: under mpirun, ranks
// sharing one GPU (MPI backend, as test_cuda_tp.cpp's runs), every layout's
// steps follow one process's and rank 0 alone reports (bench_layouts.h).
// Skipped without a GPU; runs on the host-built engine in CI; not yet run on a GPU.
#ifdef KVS_CUDA
#include <gtest/gtest.h>

#include "bench_layouts.h"
#include "cuda_test_util.h"

using namespace kvs::testing_util;

TEST(CudaBench, EveryLayoutTimesTheStepOfOneProcess) {
  KVS_REQUIRE_GPU();
  TmpDir tmp;
  const std::string cfg = tmp / "c.json";
  spit(cfg, tiny_cuda_config(true, 4).dump());
  // bf16 activations summed in other orders: on the host build tp = 2 moves a
  // loss or gradient norm by up to 2.6e-4 and cp = 2 by 1e-4, dp and pp by
  // 6e-10 at most. A replica reading another's sequences moved the CPU
  // engine's gradient norm by 40%.
  expect_layouts_follow_one_process(cfg,
                                    {{2, "", 2, 1, 1, 1},
                                     {2, "--set parallel.tp=2", 1, 2, 1, 1},
                                     {2, "--set parallel.cp=2", 1, 1, 2, 1},
                                     {2, "--set parallel.pp=2", 1, 1, 1, 2}},
                                    2e-3);
}

#endif  // KVS_CUDA
