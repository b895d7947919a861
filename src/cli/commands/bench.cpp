// `bench`: median time of whole optimizer steps (forward + backward of every
// micro-batch, gradient norm, AdamW) on random tokens, after warm-up.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "cli/commands/commands.h"
#include "core/rng.h"
#include "core/runtime_env.h"
#include "model/config.h"
#include "model/engine.h"
#include "model/flops.h"

extern "C" void openblas_set_num_threads(int);

namespace kvs::cli {

namespace {
std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Median ms/step and tokens/s of training steps for a config");
  struct Args {
    std::string config, device;
    std::vector<std::string> sets;
    int warmup = 3, steps = 10;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "Experiment config (JSON)")->required();
  cmd->add_option("--set", a->sets, "Override a config key (repeatable)");
  cmd->add_option("--device", a->device, "cpu or cuda (default: the config's)");
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed steps (the median is reported)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object instead of text");
  cmd->callback([a]() {
    Config cfg = load_config(a->config, a->sets);
    if (!a->device.empty()) cfg.device = a->device;
    const int threads = cfg.train.threads > 0 ? cfg.train.threads : omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const int B = cfg.train.micro_batch_size, T = cfg.train.seq_len, accum = cfg.train.grad_accum_steps;
    auto engine = make_engine(cfg.model, B, T, cfg.device);
    std::vector<float> init(engine->layout().total);
    init_params(engine->layout(), cfg.model, cfg.train.seed, init.data());
    engine->write_params(init.data());
    const size_t N = static_cast<size_t>(B) * T;
    std::vector<int32_t> inputs(N), targets(N);
    std::vector<float> mask(N, 1.0f);
    for (size_t i = 0; i < N; ++i) {
      inputs[i] = static_cast<int32_t>(splitmix64(2 * i) % cfg.model.vocab_size);
      targets[i] = static_cast<int32_t>(splitmix64(2 * i + 1) % cfg.model.vocab_size);
    }
    const Batch batch{B, T, inputs.data(), targets.data(), mask.data()};
    std::vector<double> ms;
    for (int s = 0; s < a->warmup + a->steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      engine->zero_grad();
      for (int m = 0; m < accum; ++m) engine->forward_backward(batch, 1.0 / (N * accum));
      const double gn = engine->grad_norm();
      engine->adamw_step({1e-4, 0.9, 0.95, 1e-8, 0.1, s + 1, gn > 1.0 ? 1.0 / gn : 1.0});
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= a->warmup) ms.push_back(dt);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double tokens = static_cast<double>(N) * accum;
    const double tok_s = tokens / (median / 1000.0);
    const double flops = train_flops_per_token(cfg.model, T);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double peak_mib = ru.ru_maxrss / 1024.0;
    if (a->json) {
      nlohmann::json j = {{"config", a->config},
                          {"device", cfg.device},
                          {"threads", threads},
                          {"kv_shift", cfg.model.kv_shift.enabled},
                          {"tokens_per_step", tokens},
                          {"median_ms_per_step", median},
                          {"min_ms_per_step", ms.front()},
                          {"max_ms_per_step", ms.back()},
                          {"tokens_per_s", tok_s},
                          {"model_tflops_per_s", flops * tok_s / 1e12},
                          {"flops_formula", kFlopsFormula},
                          {"peak_rss_mib", peak_mib},
                          {"openblas_core", openblas_core_name()},
                          {"env",
                           {{"OMP_WAIT_POLICY", env_or("OMP_WAIT_POLICY")},
                            {"GOMP_SPINCOUNT", env_or("GOMP_SPINCOUNT")},
                            {"OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE")}}}};
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("%s on %s (%d threads), %d x %d tokens x %d accum, kv_shift %s\n", a->config.c_str(),
                cfg.device.c_str(), threads, B, T, accum, describe_kv_shift(cfg.model.kv_shift).c_str());
    std::printf("median %.2f ms/step (min %.2f, max %.2f over %d steps) | %.0f tokens/s | %.3f model TFLOP/s (%s)\n",
                median, ms.front(), ms.back(), a->steps, tok_s, flops * tok_s / 1e12, kFlopsFormula);
    std::printf("peak memory (RSS) %.1f MiB | OpenBLAS kernels: %s\n", peak_mib, openblas_core_name().c_str());
  });
}

}  // namespace kvs::cli
