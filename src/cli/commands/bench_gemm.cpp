// `bench-gemm`: the CUDA engine's GEMMs of one micro-batch of a config (every
// projection's forward, input gradient and weight gradient, the shapes
// `bench --profile` names), each run with the first --algos algorithms
// cuBLASLt's heuristic offers. The engine runs the first (kernels/cuda/
// matmul.h); the table says how much faster the best of the others is, per
// GEMM and over a whole step's GEMMs, so that choosing algorithms by timing
// (issue 12: "cuBLASLt algorithm choice") is decided from a measurement.
// Timed with CUDA events, median of --reps runs after one untimed run.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands/commands.h"
#include "core/error.h"
#include "core/op_stat.h"
#include "model/config.h"
#include "parallel/tensor_parallel.h"
#ifdef KVS_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/matmul.h"
#endif

namespace kvs::cli {

#ifdef KVS_CUDA
namespace {

constexpr cuda::ErrorCheck check{"bench-gemm"};

// One projection of the model: y[N, out] = x[N, in] W[out, in]^T, `per_step` times a micro-batch.
struct Projection {
  const char* label;
  int in, out, per_step;
};

}  // namespace
#endif

void add_bench_gemm(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-gemm",
      "CUDA: the step's GEMMs for a config with each of cuBLASLt's first heuristic algorithms; how much faster the "
      "best is than the first, which the engine runs");
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int algos = 8, reps = 10;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "Experiment config (JSON): the model and train.micro_batch_size x seq_len")
      ->required();
  cmd->add_option("--set", a->sets, "Override a config key (repeatable)");
  cmd->add_option("--algos", a->algos, "Heuristic algorithms per GEMM (the first is the engine's)")
      ->capture_default_str();
  cmd->add_option("--reps", a->reps, "Timed runs per algorithm (median reported)")->capture_default_str();
  cmd->callback([a]() {
    const Config cfg = load_config(a->config, a->sets);
    KVS_CHECK(a->algos >= 1 && a->reps >= 1, "bench-gemm: --algos and --reps must be >= 1");
#ifdef KVS_CUDA
    std::string why;
    if (cuda::device_count(&why) == 0) fail("bench-gemm: no usable GPU ({})", why);
    const ModelConfig& m = cfg.model;
    const LocalDims d = LocalDims::of(m, 0, 1);
    const int N = cfg.train.micro_batch_size * cfg.train.seq_len, L = m.num_hidden_layers;
    const int QKV = d.QD() + 2 * d.KD();
    const std::vector<Projection> projections = {{"qkv proj", d.C, QKV, L},
                                                 {"o proj", d.QD(), d.C, L},
                                                 {"gate,up proj", d.C, 2 * d.F, L},
                                                 {"down proj", d.F, d.C, L},
                                                 {"lm head", d.C, d.V, 1}};
    size_t w_max = 0, x_max = 0;
    for (const Projection& p : projections) {
      w_max = std::max(w_max, static_cast<size_t>(p.in) * p.out);
      x_max = std::max(x_max, static_cast<size_t>(N) * std::max(p.in, p.out));
    }
    using bf16 = __nv_bfloat16;
    void *w = nullptr, *x = nullptr, *y = nullptr, *dw = nullptr;
    check(cudaMalloc(&w, w_max * sizeof(bf16)), "cudaMalloc");
    check(cudaMalloc(&x, x_max * sizeof(bf16)), "cudaMalloc");
    check(cudaMalloc(&y, x_max * sizeof(bf16)), "cudaMalloc");
    check(cudaMalloc(&dw, w_max * sizeof(float)), "cudaMalloc");
    // bf16 0x3c3c (0.0115) everywhere: finite products of a realistic size; the values do not change the speed.
    check(cudaMemset(w, 0x3c, w_max * sizeof(bf16)), "cudaMemset");
    check(cudaMemset(x, 0x3c, x_max * sizeof(bf16)), "cudaMemset");
    check(cudaMemset(y, 0x3c, x_max * sizeof(bf16)), "cudaMemset");
    check(cudaMemset(dw, 0, w_max * sizeof(float)), "cudaMemset");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda::Matmul mm;
    std::printf("cuBLASLt GEMMs of %s on %s: micro-batch %d x %d (N = %d rows), up to %d heuristic algorithms, median "
                "of %d runs\n",
                a->config.c_str(), cuda::device_name(0).c_str(), cfg.train.micro_batch_size, cfg.train.seq_len, N,
                a->algos, a->reps);
    std::printf("%-40s %6s %9s %10s %5s %10s %8s\n", "GEMM (bench --profile's name)", "algos", "first ms",
                "first TF/s", "best", "best TF/s", "1st/best");
    double first_step = 0, best_step = 0;
    auto row = [&](const std::string& name, double flops, int per_step,
                   const std::vector<cuda::Matmul::AlgoTime>& t) {
      if (t.empty()) {  // every candidate refused to run (Matmul::time_results skips them)
        std::printf("%-40s %6d %9s  no algorithm ran\n", name.c_str(), 0, "-");
        return;
      }
      const auto best = std::min_element(t.begin(), t.end(), [](const auto& p, const auto& q) { return p.ms < q.ms; });
      // The heuristic's first is rank 0; if it was skipped, the first that ran stands in for it.
      const double first_ms = t.front().ms, best_ms = best->ms;
      auto tflops = [&](double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; };
      std::printf("%-40s %6zu %9.3f %10.1f %5d %10.1f %8.3f\n", name.c_str(), t.size(), first_ms, tflops(first_ms),
                  best->rank, tflops(best_ms), best_ms > 0 ? first_ms / best_ms : 1.0);
      first_step += per_step * first_ms;
      best_step += per_step * best_ms;
    };
    for (const Projection& p : projections) {
      const kvs::profile::GemmLabel label(p.label);
      const double flops = 2.0 * N * p.in * p.out;
      auto* W = static_cast<bf16*>(w);
      auto* X = static_cast<bf16*>(x);
      auto* Y = static_cast<bf16*>(y);
      // As Matmul::forward, backward_input and backward_weight call gemm() (matmul.cu's mapping).
      row(kvs::profile::gemm_name("fwd", N, p.out, p.in), flops, p.per_step,
          mm.time_algorithms(true, false, p.out, N, p.in, W, p.in, X, p.in, 0.0f, Y, p.out, false, a->algos, a->reps,
                             stream));
      row(kvs::profile::gemm_name("bwd dinp", N, p.in, p.out), flops, p.per_step,
          mm.time_algorithms(false, false, p.in, N, p.out, W, p.in, Y, p.out, 0.0f, X, p.in, false, a->algos, a->reps,
                             stream));
      row(kvs::profile::gemm_name("bwd dW", p.out, p.in, N), flops, p.per_step,
          mm.time_algorithms(false, true, p.in, p.out, N, X, p.in, Y, p.out, 1.0f, dw, p.in, true, a->algos, a->reps,
                             stream));
    }
    std::printf("a micro-batch's GEMMs (each row times its calls): %.2f ms with the heuristic's first algorithms, "
                "%.2f ms with the best of %d: %.3fx\n",
                first_step, best_step, a->algos, best_step > 0 ? first_step / best_step : 1.0);
    cudaStreamDestroy(stream);
    for (void* p : {w, x, y, dw}) cudaFree(p);
#else
    fail("bench-gemm: this kvshift was built without CUDA (configure with -DKVS_CUDA=ON)");
#endif
  });
}

}  // namespace kvs::cli
