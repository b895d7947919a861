// `kvshift dist-check`: detects the launch, runs the bootstrap among
// the ranks and prints one line per rank, so that tests and first runs on a
// cluster can check a launch before training. With --nccl (CUDA builds) it
// also builds the NCCL communicator and checks an all-reduce.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/launch.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "dist/nccl_comm.h"
#include "kernels/cuda/check.h"
#endif

namespace kvs::cli {
namespace {

#ifdef KVS_CUDA
// Each rank contributes rank+1 to every element: the sum is W(W+1)/2 everywhere.
void check_nccl(const dist::LaunchInfo& l, const dist::BootstrapOptions& o, const std::string& id_on_rank0) {
  const int device = dist::select_device(l);
  auto comm = dist::make_nccl(l, id_on_rank0, device, o.timeout_s, o.timeout_s);
  const size_t n = 1 << 20;
  std::vector<float> h(n, static_cast<float>(l.rank + 1));
  const std::string who = "rank " + std::to_string(l.rank);
  auto cuda = [&](cudaError_t e, const char* what) { kvs::cuda::check(e, who, what); };
  float* d = nullptr;
  cuda(cudaMalloc(&d, n * sizeof(float)), "cudaMalloc");
  cuda(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  comm->all_reduce(d, n, dist::DType::F32, dist::ReduceOp::Sum);
  cuda(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda(cudaFree(d), "cudaFree");
  const float want = static_cast<float>(l.world_size) * (l.world_size + 1) / 2;
  for (size_t i = 0; i < n; ++i)
    KVS_CHECK(h[i] == want, "rank {}: NCCL all-reduce gave {} at element {}, expected {}", l.rank, h[i], i, want);
  comm->barrier();
  std::printf("rank %d/%d: NCCL all-reduce of %zu floats on GPU %d ok\n", l.rank, l.world_size, n, device);
}
#endif

}  // namespace

void add_dist_check(CLI::App& app) {
  auto* cmd = app.add_subcommand("dist-check", "Check a multi-process launch: bootstrap (and NCCL) among the ranks");
  struct Args {
    double timeout = 0;
    bool nccl = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--timeout", a->timeout, "Bootstrap timeout in seconds (default KVS_BOOTSTRAP_TIMEOUT_S or 120)")
      ->check(kPositiveSeconds);
  cmd->add_flag("--nccl", a->nccl, "Also create the NCCL communicator and check an all-reduce (CUDA builds)");
  cmd->callback([a]() {
    const dist::LaunchInfo l = dist::detect_launch();
    dist::BootstrapOptions o = dist::bootstrap_options(l);
    if (a->timeout > 0) o.timeout_s = a->timeout;
#ifdef KVS_CUDA
    const std::string blob = a->nccl && l.rank == 0 ? dist::nccl_unique_id() : std::string("kvshift");
#else
    KVS_CHECK(!a->nccl, "dist-check --nccl needs a CUDA build (KVS_CUDA)");
    const std::string blob = "kvshift";
#endif
    const std::string got = dist::bootstrap_exchange(l, o, blob);
    std::printf("rank %d/%d local %d launcher %s: joined\n", l.rank, l.world_size, l.local_rank, l.launcher.c_str());
    if (l.rank == 0)
      std::printf("all %d ranks joined%s\n", l.world_size,
                  l.world_size > 1 ? (" the bootstrap at " + o.addr + ":" + std::to_string(o.port)).c_str() : "");
    std::fflush(stdout);
#ifdef KVS_CUDA
    if (a->nccl) check_nccl(l, o, got);
#endif
  });
}

}  // namespace kvs::cli
