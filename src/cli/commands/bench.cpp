// `bench`: median time of whole optimizer steps (forward + backward of every
// micro-batch, gradient norm, AdamW) on random tokens, after warm-up: the
// training step itself (train/train_step.h), so under mpirun or torchrun in
// the config's parallel layout. On the CPU also the model FLOP/s as a
// fraction of the machine's calibrated fp32 SGEMM peak on the same threads
// (kernels/cpu/gemm_peak.h).
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <optional>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/commands/world_guard.h"
#include "core/cpu_budget.h"
#include "core/cpu_steal.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/gemm_library.h"
#include "kernels/cpu/gemm_peak.h"
#include "kernels/cpu/op_profile.h"
#include "model/config.h"
#include "model/cpu_replicas.h"
#include "model/engine.h"
#include "model/flops.h"
#include "train/rank_agreement.h"
#include "train/train_step.h"
#ifdef KVS_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/kernel_profile.h"
#endif


namespace kvs::cli {

namespace {
double loadavg_1min() {
  double l = 0;
  return getloadavg(&l, 1) == 1 ? l : 0.0;
}

std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct BenchResult {
  double median_ms = 0, min_ms = 0, max_ms = 0, tokens = 0, tok_s = 0, tflops = 0, mfu = 0;
  double peak_tflops = 0;  // CUDA: the GPU's dense bf16 peak (TrainStep::device_peak_tflops), MFU's denominator
  double median_cpu_ms = 0;  // process CPU time per step, all threads: less sensitive to other load than wall time
  int processes = 1;    // tokens and tok_s are the whole world's, tflops and mfu per process
  std::string layout;   // TrainStep::layout(), and as JSON
  nlohmann::json layout_json;
  double peak_mib = 0;  // host RSS (cpu) or device memory in use (cuda); the largest process's
  std::string peak_what;
  std::vector<kvs::profile::OpStat> ops;  // with --profile: summed over the timed steps
  int steps = 0;
  double mean_ms = 0;  // the profile's shares are of the mean step
  std::optional<double> steal;  // the hypervisor's share of the CPUs during the timed steps (Linux VMs)
  // Every step's loss and gradient norm (warm-up included), the same on every rank: the step is
  // the training step, so they follow one process's in any parallel layout.
  std::vector<double> losses, grad_norms;
  std::string gemm_timing;  // train.time_gemm_algorithms: what the timing after the first step chose
  int replicas = 1;         // the CPU engine's thread replicas (model/cpu_replicas.h)
};

// --profile: the CPU engine's ops are timed from the first timed step on.
// The CUDA engine's marks go on one step earlier: a stream's first mark only
// starts its clock (kernels/cuda/kernel_profile.h), so the last untimed step
// starts them and the timed steps' every op has one.
void profile_step_begins(int step, int warmup, Device device) {
  if (device == Device::Cpu) {
    if (step == warmup) {
      cpu::profile::take();
      cpu::profile::set_enabled(true);
    }
    return;
  }
#ifdef KVS_CUDA
  if (step == std::max(warmup - 1, 0)) cuda::profile::set_enabled(true);
  if (step == warmup && warmup > 0) cuda::profile::restart();
#endif
}

std::vector<kvs::profile::OpStat> profile_take(Device device) {
  if (device == Device::Cpu) {
    cpu::profile::set_enabled(false);
    return cpu::profile::take();
  }
#ifdef KVS_CUDA
  auto ops = cuda::profile::take();
  cuda::profile::set_enabled(false);
  return ops;
#else
  return {};
#endif
}

// Adds a step's per-op times into a run's.
void merge_ops(std::vector<kvs::profile::OpStat>& into, const std::vector<kvs::profile::OpStat>& ops) {
  for (const auto& op : ops) {
    auto it =
        std::find_if(into.begin(), into.end(), [&](const kvs::profile::OpStat& o) { return o.name == op.name; });
    if (it == into.end()) it = into.insert(into.end(), kvs::profile::OpStat{op.name});
    it->seconds += op.seconds;
    it->flops += op.flops;
    it->calls += op.calls;
    it->threads = op.threads;
  }
}

// The CPU GEMMs' library and threading for a bench run's steps.
struct GemmVariant {
  cpu::GemmLibrary library;
  cpu::GemmThreading threading;
};

// Times whole optimizer steps of `cfg` on random tokens: the training step
// itself (train/train_step.h) in the config's parallel layout over `world`'s
// processes, each rank with its part of the model. One result per entry of
// `gemms` (the CPU's GEMM libraries and threadings; empty: as they are), or
// per entry of `replicas` (the CPU engine's thread replicas: one engine each,
// with the same weights). With two, the steps alternate between them, so that
// both see the same machine minute by minute: `warmup` untimed steps each,
// then `steps` timed. A step's time is the slowest rank's.
std::vector<BenchResult> bench_one(const Config& cfg, dist::Communicator& world, int warmup, int steps, bool profile,
                                   const std::vector<GemmVariant>& gemms, const std::vector<CpuReplicas>& replicas) {
  const int T = cfg.train.seq_len, GB = cfg.global_batch_sequences();
  std::vector<std::unique_ptr<TrainStep>> engines;
  for (size_t e = 0; e < std::max<size_t>(1, replicas.size()); ++e) {
    const CpuReplicas before = cpu_replicas_setting();
    if (!replicas.empty()) set_cpu_replicas(replicas[e]);
    engines.push_back(std::make_unique<TrainStep>(cfg, world));
    set_cpu_replicas(before);
    TrainStep& step = *engines.back();
    step.shard_optimizer();  // ZeRO-1 before the weights are written: the whole fp32 master never exists
    write_params_in_windows(step.engine(),
                            [&](size_t at, size_t n, float* w) { step.io().init_local(cfg.train.seed, at, n, w); });
    step.engine().reserve_optimizer_state();
  }
  TrainStep& step = *engines[0];
  // Sequence g of the global batch holds the same tokens in every layout; this replica's are its share.
  const int LB = step.replica_sequences();
  const size_t first = static_cast<size_t>(step.groups().dp_rank) * LB * T, N = static_cast<size_t>(LB) * T;
  std::vector<int32_t> inputs(N), targets(N);
  std::vector<float> mask(N, 1.0f);
  for (size_t i = 0; i < N; ++i) {
    inputs[i] = static_cast<int32_t>(splitmix64(2 * (first + i)) % cfg.model.vocab_size);
    targets[i] = static_cast<int32_t>(splitmix64(2 * (first + i) + 1) % cfg.model.vocab_size);
  }
  const Batch replica{LB, T, inputs.data(), targets.data(), mask.data()};
  const double tokens = static_cast<double>(GB) * T;
  const int variants = std::max<int>(1, static_cast<int>(std::max(gemms.size(), replicas.size())));
  // The CPU profile is taken after every timed step, into that step's variant.
  const bool profile_each_step = profile && cfg.device == Device::Cpu;
  std::vector<BenchResult> res(variants);
  std::vector<std::vector<double>> ms(variants), cpu_ms(variants);
  std::optional<CpuTimes> times_before;
  const int first_timed = warmup * variants;
  for (int s = 0; s < (warmup + steps) * variants; ++s) {
    const int v = s % variants;
    if (!gemms.empty()) {
      cpu::set_gemm_library(gemms[v].library);
      cpu::set_gemm_threading(gemms[v].threading);
    }
    if (profile) profile_step_begins(s, first_timed, cfg.device);
    if (s == first_timed) times_before = read_cpu_times();
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    // The gradient norm is all-reduced: a host value, so the step's time is all in.
    TrainStep& e = *engines[engines.size() == 1 ? 0 : v];
    const TrainStep::Gradients g = e.compute_gradients(replica, 1.0 / tokens);
    const int64_t adam_step = engines.size() == 1 ? s + 1 : s / variants + 1;  // this engine's own count
    e.optimizer_step({1e-4, 0.9, 0.95, 1e-8, 0.1, adam_step, g.norm > 1.0 ? 1.0 / g.norm : 1.0});
    res[v].losses.push_back(g.loss_sum / tokens);  // every token is scored
    res[v].grad_norms.push_back(g.norm);
    const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (s >= first_timed) {
      ms[v].push_back(dt);
      cpu_ms[v].push_back(cpu);
      if (profile_each_step) merge_ops(res[v].ops, cpu::profile::take());
    }
  }
  if (profile) {
    std::vector<kvs::profile::OpStat> rest = profile_take(cfg.device);
    if (!profile_each_step) res[0].ops = std::move(rest);
  }
  for (std::vector<double>& m : ms) world.all_reduce(m.data(), m.size(), dist::DType::F64, dist::ReduceOp::Max);
  std::optional<double> steal;
  if (const auto after = read_cpu_times(); times_before && after) steal = steal_fraction(*times_before, *after);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const std::string gemm_timing = step.take_gemm_timing();
  for (int v = 0; v < variants; ++v) {
    BenchResult& r = res[v];
    r.gemm_timing = gemm_timing;
    if (const auto* rep = dynamic_cast<const CpuReplicaEngine*>(&engines[engines.size() == 1 ? 0 : v]->engine()))
      r.replicas = rep->replicas();
    r.steps = steps;
    r.steal = steal;
    std::sort(ms[v].begin(), ms[v].end());
    std::sort(cpu_ms[v].begin(), cpu_ms[v].end());
    r.median_ms = ms[v][ms[v].size() / 2];
    r.min_ms = ms[v].front();
    r.max_ms = ms[v].back();
    r.median_cpu_ms = cpu_ms[v][cpu_ms[v].size() / 2];
    for (double m : ms[v]) r.mean_ms += m / ms[v].size();
    r.tokens = tokens;
    r.tok_s = r.tokens / (r.median_ms / 1000.0);
    r.processes = world.size();
    r.layout = step.layout();
    r.layout_json = step.layout_json();
    r.tflops = train_flops_per_token(cfg.model, T) * r.tok_s / r.processes / 1e12;
    r.peak_mib = ru.ru_maxrss / 1024.0;
    r.peak_what = "host RSS";
#ifdef KVS_CUDA
    if (cfg.device == Device::Cuda) {
      // Everything is allocated up front, so the memory in use now is the peak.
      r.peak_mib = static_cast<double>(cuda::device_memory_used(step.gpu())) / 1048576.0;
      r.peak_what = "GPU memory in use";
      r.peak_tflops = step.device_peak_tflops();
      r.mfu = r.peak_tflops > 0 ? r.tflops / r.peak_tflops : 0;
    }
#endif
    world.all_reduce(&r.peak_mib, 1, dist::DType::F64, dist::ReduceOp::Max);
    if (world.size() > 1) r.peak_what += ", the largest process's";
  }
  return res;
}

struct ProfileRow {
  std::string name;
  double calls = 0, ms = 0, share = 0, gflops = 0, of_peak = 0;
};

// Per step, slowest first, then "other": the step's time outside every timed op.
// An op that ran on fewer threads than the run (inside a thread replica: one)
// is set against that share of the peak: peak_gflops x its threads / `threads`.
std::vector<ProfileRow> profile_rows(const BenchResult& r, double peak_gflops, int threads = 0) {
  std::vector<ProfileRow> rows;
  double timed = 0, gemm_ms = 0, gemm_flops = 0, gemm_peak_ms = 0;  // the last: sum of ms x its peak
  for (const auto& op : r.ops) {
    ProfileRow row{op.name, double(op.calls) / r.steps, 1000.0 * op.seconds / r.steps};
    row.share = row.ms / r.mean_ms;
    if (op.flops > 0 && op.seconds > 0) row.gflops = op.flops / op.seconds / 1e9;
    const double peak = op.threads > 0 && threads > 0 ? peak_gflops * op.threads / threads : peak_gflops;
    if (peak > 0) row.of_peak = row.gflops / peak;
    timed += row.ms;
    if (op.name.find(" fwd ") != std::string::npos || op.name.find(" bwd d") != std::string::npos) {
      gemm_ms += row.ms;
      gemm_flops += op.flops / r.steps;
      gemm_peak_ms += row.ms * peak;
    }
    rows.push_back(row);
  }
  std::sort(rows.begin(), rows.end(), [](const ProfileRow& a, const ProfileRow& b) { return a.ms > b.ms; });
  ProfileRow other{"other (outside the timed ops)", 0, r.mean_ms - timed};
  other.share = other.ms / r.mean_ms;
  rows.push_back(other);
  ProfileRow gemms{"= all GEMMs", 0, gemm_ms, gemm_ms / r.mean_ms, gemm_ms > 0 ? gemm_flops / gemm_ms / 1e6 : 0};
  if (gemm_peak_ms > 0) gemms.of_peak = gemm_flops / gemm_peak_ms / 1e6;
  rows.push_back(gemms);
  return rows;
}

void print_profile(const BenchResult& r, double peak_gflops, int threads) {
  if (r.replicas > 1)
    std::printf("(thread replicas: the forward and backward ops are the first of %d replicas', on its one thread "
                "while the others run theirs, against one thread's share of the calibrated peak; \"other\" holds "
                "its wait for the others)\n",
                r.replicas);
  std::printf("per-op profile (mean over %d steps of %.2f ms; GEMMs are MxNxK of out[M,N] += A[M,K] B[K,N]):\n",
              r.steps, r.mean_ms);
  std::printf("  %-44s %7s %9s %7s %9s %8s\n", "op", "calls", "ms/step", "share", "GFLOP/s", "of peak");
  for (const ProfileRow& row : profile_rows(r, peak_gflops, threads)) {
    std::printf("  %-44s %7.0f %9.3f %6.1f%%", row.name.c_str(), row.calls, row.ms, 100 * row.share);
    if (row.gflops > 0) std::printf(" %9.1f", row.gflops);
    else std::printf(" %9s", "");
    if (row.of_peak > 0) std::printf(" %7.1f%%", 100 * row.of_peak);
    std::printf("\n");
  }
}

// --compare-shift --profile: where the KV-shifting run's extra time goes. Per
// op (the union of both runs' ops, "other" included), its ms/step with KV
// shifting minus without, largest first; they sum to the difference of the
// two profiled mean steps.
struct ProfileDifference {
  std::string name;
  double ms = 0, calls_on = 0, calls_off = 0;
};
std::vector<ProfileDifference> profile_difference(const BenchResult& off, const BenchResult& on) {
  std::vector<ProfileDifference> out;
  auto add = [&](const BenchResult& r, double sign) {
    for (const ProfileRow& row : profile_rows(r, 0)) {
      if (row.name.rfind("= ", 0) == 0) continue;  // the sums over rows
      auto it = std::find_if(out.begin(), out.end(), [&](const ProfileDifference& d) { return d.name == row.name; });
      if (it == out.end()) it = out.insert(out.end(), ProfileDifference{row.name});
      it->ms += sign * row.ms;
      (sign > 0 ? it->calls_on : it->calls_off) = row.calls;
    }
  };
  add(on, 1.0);
  add(off, -1.0);
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileDifference& a, const ProfileDifference& b) { return a.ms > b.ms; });
  return out;
}

void print_profile_difference(const BenchResult& off, const BenchResult& on) {
  std::printf("KV shifting's extra time per op (ms/step with it minus without; calls/step with, without), the 10 "
              "largest of %.2f ms:\n",
              on.mean_ms - off.mean_ms);
  const std::vector<ProfileDifference> d = profile_difference(off, on);
  for (size_t i = 0; i < d.size() && i < 10; ++i)
    std::printf("  %-44s %+9.3f %7.0f %7.0f\n", d[i].name.c_str(), d[i].ms, d[i].calls_on, d[i].calls_off);
}

// peak_key: "fraction_of_sgemm_peak" (CPU) or "fraction_of_bf16_peak" (CUDA).
nlohmann::json profile_json(const BenchResult& r, double peak_gflops, int threads, const char* peak_key) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ProfileRow& row : profile_rows(r, peak_gflops, threads))
    rows.push_back({{"op", row.name},
                    {"calls_per_step", row.calls},
                    {"ms_per_step", row.ms},
                    {"share", row.share},
                    {"gflops", row.gflops},
                    {peak_key, row.of_peak}});
  return rows;
}

// How the GEMMs' threads share a product on `lib`, for the text output.
const char* threading_text(cpu::GemmLibrary lib, cpu::GemmThreading setting) {
  return cpu::effective_gemm_threading(lib, setting) == cpu::GemmThreading::kSplit ? "one tile per thread"
                                                                                 : "the library's own threading";
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench",
      "Median ms/step and tokens/s of training steps for a config; under mpirun or torchrun the step runs in the "
      "config's parallel layout (parallel.tp/cp/pp, dp the rest) and rank 0 reports the world's tokens/s and each "
      "process's TFLOP/s");
  struct Args {
    std::string config, device;
    std::vector<std::string> sets;
    int warmup = 3, steps = 10;
    bool json = false, compare_shift = false, compare_gemm = false, compare_gemm_threads = false,
         compare_replicas = false, compare_overlap = false, compare_gemm_timing = false, recalibrate = false, profile = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config, "Experiment config (JSON)")->required();
  cmd->add_option("--set", a->sets, "Override a config key (repeatable)");
  cmd->add_option("--device", a->device, "cpu or cuda (default: the config's)");
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed steps (the median is reported)")->capture_default_str();
  cmd->add_flag("--compare-shift", a->compare_shift,
                "Time the config with kv_shift off and on in the same run and print the overhead of the shift");
  cmd->add_flag("--compare-gemm", a->compare_gemm,
                "CPU: time the config's steps on OpenBLAS and on oneDNN GEMMs, alternating step by step on one "
                "engine, and print the step-time ratio (the default library is chosen per CPU; "
                "KVS_CPU_GEMM=openblas|onednn overrides it)");
  cmd->add_flag("--compare-gemm-threads", a->compare_gemm_threads,
                "CPU: time the config's steps with each GEMM split into one tile per thread and with the GEMM "
                "library's own threading, alternating step by step on one engine, and print the step-time ratio "
                "(the default: split on OpenBLAS, the library's own on oneDNN; KVS_CPU_GEMM_THREADS=split|library "
                "overrides it)");
  cmd->add_flag("--compare-replicas", a->compare_replicas,
                "CPU: time the config's steps on one engine whose threads share each op and on thread replicas "
                "(each thread the whole forward and backward of its share of the micro-batch, gradients summed "
                "once a step), two engines with the same weights, alternating step by step, and print the "
                "step-time ratio (the default: replicas where there are 2 or more threads and as many sequences; "
                "KVS_CPU_REPLICAS=off turns them off)");
  cmd->add_flag("--compare-overlap", a->compare_overlap,
                "CUDA: time the config with train.overlap_optimizer off and on in the same run (AdamW after the "
                "step, or overlapping the next forward) and print the step-time ratio");
  cmd->add_flag("--compare-gemm-timing", a->compare_gemm_timing,
                "CUDA: time the config with cuBLASLt's first algorithm for every GEMM and with the fastest of its "
                "candidates (train.time_gemm_algorithms: timed after the first warm-up step) in the same run and "
                "print the step-time ratio");
  cmd->add_flag("--profile", a->profile,
                "Time every op of the timed steps: on the CPU each op's wall time (GEMMs by shape, attention, "
                "shift+RoPE, norms, SwiGLU, cross-entropy, AdamW, grad norm) against the calibrated SGEMM peak; on "
                "CUDA each kernel's and cuBLASLt GEMM's GPU time from CUDA events (no ncu or nsys needed) against "
                "the dense bf16 peak; share of the step, calls and GFLOP/s. With --compare-shift, both runs' "
                "profiles and the ops that make KV shifting's extra time");
  cmd->add_flag("--recalibrate", a->recalibrate,
                "Measure the fp32 SGEMM peak again instead of reading it from the cache (CPU)");
  cmd->add_flag("--json", a->json,
                "Print one JSON object (a list with any --compare-*) instead of text; it also "
                "holds every step's loss and gradient norm (\"losses\", \"grad_norms\"), which follow one "
                "process's in any parallel layout");
  cmd->callback([a]() {
    Config cfg = load_config(a->config, a->sets);
    if (!a->device.empty()) {  // the device's own rules (CUDA: head_dim, no document masking) apply too
      cfg.device = device_flag(a->device);
      validate(cfg, a->config + " with --device " + a->device);
    }
    KVS_CHECK(a->steps >= 1 && a->warmup >= 0, "bench: --steps must be >= 1 and --warmup >= 0");
    KVS_CHECK(a->compare_gemm + a->compare_gemm_threads + a->compare_replicas + a->compare_shift +
                      a->compare_overlap + a->compare_gemm_timing <=
                  1,
              "bench: --compare-gemm, --compare-gemm-threads, --compare-replicas, --compare-gemm-timing, "
              "--compare-shift and --compare-overlap are separate runs");
    KVS_CHECK(!a->compare_gemm_timing || cfg.device == Device::Cuda,
              "bench: --compare-gemm-timing times cuBLASLt's algorithms; this run's device is {}",
              to_string(cfg.device));
    KVS_CHECK(!(a->compare_gemm_timing || cfg.train.time_gemm_algorithms) || a->warmup >= 1,
              "bench: timed GEMM algorithms are chosen after the first step: --warmup must be at least 1");
    KVS_CHECK(!a->compare_overlap || cfg.device == Device::Cuda,
              "bench: --compare-overlap times the CUDA engine's overlapped AdamW; this run's device is {}",
              to_string(cfg.device));
    KVS_CHECK(!a->compare_gemm || cfg.device == Device::Cpu,
              "bench: --compare-gemm compares the CPU's GEMM libraries; this run's device is {}",
              to_string(cfg.device));
    KVS_CHECK(!a->compare_gemm_threads || cfg.device == Device::Cpu,
              "bench: --compare-gemm-threads compares the CPU GEMMs' threading; this run's device is {}",
              to_string(cfg.device));
    KVS_CHECK(!a->compare_replicas || cfg.device == Device::Cpu,
              "bench: --compare-replicas compares the CPU engine's thread replicas; this run's device is {}",
              to_string(cfg.device));
    // Under mpirun or torchrun the step runs in the config's parallel layout
    // (docs/PARALLEL.md) and rank 0 prints; a single process runs it alone.
    auto world = dist::make_world(cfg.device);
    check_layout_or_exit(world, cfg);
    const bool rank0 = world->rank() == 0;
    const int threads = use_threads(cfg.train.threads);
    KVS_CHECK(!a->compare_gemm_threads || threads > 1,
              "bench: --compare-gemm-threads compares each GEMM split over the threads with the library's own "
              "threading; on 1 thread both are the same product (set train.threads above 1)");
    const int B = cfg.train.micro_batch_size, T = cfg.train.seq_len, accum = cfg.train.grad_accum_steps;
    KVS_CHECK(!a->compare_replicas || (threads > 1 && threads <= B),
              "bench: --compare-replicas needs at least 2 threads and a micro-batch of at least as many sequences "
              "(train.threads {}, train.micro_batch_size {}): one sequence per replica", threads, B);
    const std::vector<CpuReplicas> replicas =
        a->compare_replicas ? std::vector<CpuReplicas>{CpuReplicas::kOff, CpuReplicas::kAuto} : std::vector<CpuReplicas>{};
    // One engine per config; with --compare-gemm one config whose steps alternate libraries.
    std::vector<Config> runs;
    const cpu::GemmLibraryChoice& gemm_choice = cpu::select_gemm_library();
    const GemmVariant default_gemm{cpu::gemm_library(), cpu::gemm_threading()};
    std::vector<GemmVariant> gemms;
    if (a->compare_gemm)
      gemms = {{cpu::GemmLibrary::OpenBLAS, default_gemm.threading}, {cpu::GemmLibrary::OneDNN, default_gemm.threading}};
    if (a->compare_gemm_threads)
      gemms = {{default_gemm.library, cpu::GemmThreading::kLibrary}, {default_gemm.library, cpu::GemmThreading::kSplit}};
    const bool compare_gemms = !gemms.empty();
    if (a->compare_shift) {
      Config off = cfg, on = cfg;
      off.model.kv_shift.enabled = false;
      on.model.kv_shift.enabled = true;
      runs = {off, on};
    } else if (a->compare_overlap) {
      Config off = cfg, on = cfg;
      off.train.overlap_optimizer = false;
      on.train.overlap_optimizer = true;
      runs = {off, on};
    } else if (a->compare_gemm_timing) {
      Config off = cfg, on = cfg;
      off.train.time_gemm_algorithms = false;
      on.train.time_gemm_algorithms = true;
      runs = {off, on};
    } else {
      runs = {cfg};
    }
    const bool cpu_run = cfg.device == Device::Cpu;
    const cpu::BlasChoice& blas = cpu::select_blas_kernels();
    if (cpu_run && !a->json && rank0) {
      std::printf("GEMMs: %s, %s\n", gemm_choice.describe().c_str(), threading_text(default_gemm.library, default_gemm.threading));
      std::printf("OpenBLAS kernels: %s\n", blas.describe().c_str());
      if (cfg.train.threads == 0 && !process_cpu_budget().note().empty())
        std::printf("%s\n", process_cpu_budget().note().c_str());
      if (const std::string w = process_cpu_budget().oversubscribed(threads); !w.empty())
        std::printf("warning: %s\n", w.c_str());
      if (blas.slow_fallback && (default_gemm.library == cpu::GemmLibrary::OpenBLAS || a->compare_gemm))
        std::printf("warning: OpenBLAS runs its generic %s kernels on a CPU with AVX2 or AVX-512 (unset "
                    "OPENBLAS_CORETYPE, or set it to Haswell/SkylakeX): GEMMs at a third of the speed or less\n",
                    blas.core.c_str());
    }
    // The peak first: the steps then run on the threads it left warm. Rank 0
    // measures it (or reads the cache) while the others wait, sleeping, so a
    // calibration never runs beside another.
    cpu::GemmPeak peak;
    if (cpu_run && rank0) peak = cpu::sgemm_peak(threads, a->recalibrate);
    world->barrier();
    use_threads(threads);
    std::vector<BenchResult> res;
    // The profile's peak: the calibrated SGEMM peak on the CPU, the GPU's dense bf16 peak on CUDA.
    const char* profile_peak_key = cpu_run ? "fraction_of_sgemm_peak" : "fraction_of_bf16_peak";
    auto profile_peak_gflops = [&](const BenchResult& r) { return cpu_run ? peak.gflops : 1e3 * r.peak_tflops; };
    const int peak_threads = cpu_run ? peak.threads : 0;  // CPU ops on fewer threads get their share of the peak
    run_on_world(*world, [&] {
      for (const Config& c : runs) check_same_config_on_every_rank(c, *world);
      for (const Config& c : runs)
        for (BenchResult& r : bench_one(c, *world, a->warmup, a->steps, a->profile, gemms, replicas))
          res.push_back(std::move(r));
    });
    cpu::set_gemm_library(default_gemm.library);
    cpu::set_gemm_threading(default_gemm.threading);
    if (!rank0) return;
    // Each result's config and GEMM library.
    auto run_config = [&](size_t i) -> const Config& { return runs[compare_gemms || a->compare_replicas ? 0 : i]; };
    auto run_gemm = [&](size_t i) { return compare_gemms ? gemms[i] : default_gemm; };
    const bool compared =
        a->compare_shift || compare_gemms || a->compare_replicas || a->compare_overlap || a->compare_gemm_timing;
    auto peak_fraction = [&](const BenchResult& r) { return peak.gflops > 0 ? r.tflops * 1e3 / peak.gflops : 0.0; };
    // The calibration keeps its best product (other work only slows one down),
    // so on a shared machine the like-for-like figure is the fastest step's.
    auto fastest_fraction = [&](const BenchResult& r) {
      return r.min_ms > 0 ? peak_fraction(r) * r.median_ms / r.min_ms : 0.0;
    };
    if (a->json) {
      nlohmann::json all = nlohmann::json::array();
      for (size_t i = 0; i < res.size(); ++i) {
        const BenchResult& r = res[i];
        nlohmann::json j = {{"config", a->config},
                            {"device", run_config(i).device},
                            {"threads", threads},
                            {"kv_shift", run_config(i).model.kv_shift.enabled},
                            {"overlap_optimizer", run_config(i).train.overlap_optimizer},
                            {"time_gemm_algorithms", run_config(i).train.time_gemm_algorithms},
                            {"processes", r.processes},
                            {"parallel", r.layout_json},
                            {"tokens_per_step", r.tokens},
                            {"median_ms_per_step", r.median_ms},
                            {"median_cpu_ms_per_step", r.median_cpu_ms},
                            {"min_ms_per_step", r.min_ms},
                            {"max_ms_per_step", r.max_ms},
                            {"tokens_per_s", r.tok_s},
                            {"tokens_per_s_per_process", r.tok_s / r.processes},
                            {"model_tflops_per_s", r.tflops},
                            {"flops_formula", kFlopsFormula},
                            {"peak_rss_mib", r.peak_mib},
                            {"peak_memory_kind", r.peak_what},
                            {"gemm_library", cpu::gemm_library_name(run_gemm(i).library, true)},
                            {"gemm_library_source", a->compare_gemm ? "--compare-gemm" : gemm_choice.source},
                            {"gemm_threading", cpu::gemm_threading_name(cpu::effective_gemm_threading(
                                                   run_gemm(i).library, run_gemm(i).threading))},
                            {"openblas_core", cpu::openblas_core()},
                            {"openblas_core_source", blas.source},
                            {"openblas_slow_fallback", blas.slow_fallback},
                            {"loadavg_1min", loadavg_1min()},
                            {"cpu_steal_fraction", r.steal ? nlohmann::json(*r.steal) : nlohmann::json(nullptr)},
                            {"omp_places", omp_get_num_places()},  // 0 unless OMP_PLACES/OMP_PROC_BIND bind threads
                            {"affinity_cpus", process_cpu_budget().affinity_cpus},
                            {"cgroup_cpu_quota", process_cpu_budget().quota ? nlohmann::json(*process_cpu_budget().quota)
                                                                            : nlohmann::json(nullptr)},
                            {"env",
                             {{"OMP_WAIT_POLICY", env_or("OMP_WAIT_POLICY")},
                              {"GOMP_SPINCOUNT", env_or("GOMP_SPINCOUNT")},
                              {"OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE")},
                              {"KVS_CPU_GEMM", env_or("KVS_CPU_GEMM")},
                              {"KVS_CPU_GEMM_THREADS", env_or("KVS_CPU_GEMM_THREADS")},
                              {"KVS_CPU_REPLICAS", env_or("KVS_CPU_REPLICAS")}}}};
        if (cpu_run) j["cpu_replicas"] = r.replicas;
        if (r.mfu > 0) j["mfu"] = r.mfu;
        if (!r.gemm_timing.empty()) j["gemm_timing"] = r.gemm_timing;
        j["losses"] = r.losses;
        j["grad_norms"] = r.grad_norms;
        if (a->profile) j["profile"] = profile_json(r, profile_peak_gflops(r), peak_threads, profile_peak_key);
        if (a->profile && a->compare_shift && i == 1) {
          nlohmann::json d = nlohmann::json::array();
          for (const ProfileDifference& x : profile_difference(res[0], res[1]))
            d.push_back({{"op", x.name},
                         {"ms_per_step", x.ms},
                         {"calls_per_step", x.calls_on},
                         {"calls_per_step_without", x.calls_off}});
          j["profile_extra_over_vanilla"] = d;
        }
        if (peak.gflops > 0) {
          j["sgemm_peak_gflops"] = peak.gflops;
          j["fraction_of_sgemm_peak"] = peak_fraction(r);
          j["fraction_of_sgemm_peak_fastest_step"] = fastest_fraction(r);
          j["sgemm_peak_below_run"] = peak_fraction(r) > 1.0;  // calibrated under load: --recalibrate
          j["sgemm_peak"] = {{"n", peak.n},         {"threads", peak.threads},         {"core", peak.core},
                             {"cached", peak.cached}, {"measured_at", peak.measured_at}, {"loadavg_1min", peak.loadavg}};
        }
        all.push_back(j);
      }
      std::printf("%s\n", (compared ? all : all[0]).dump().c_str());
      return;
    }
    for (size_t i = 0; i < res.size(); ++i) {
      const BenchResult& r = res[i];
      const std::string device(to_string(run_config(i).device));
      // The CUDA step's settings: where AdamW runs, whether the GEMM algorithms are timed.
      std::string cuda_step = run_config(i).device != Device::Cuda        ? ""
                              : run_config(i).train.overlap_optimizer ? ", AdamW overlapping the next forward"
                                                                      : ", AdamW after the step";
      if (run_config(i).device == Device::Cuda && run_config(i).train.time_gemm_algorithms)
        cuda_step += ", GEMM algorithms timed";
      if (r.processes == 1)
        std::printf("%s on %s (%s), %d x %d tokens x %d accum, kv_shift %s%s\n", a->config.c_str(),
                    device.c_str(), thread_count(threads).c_str(), B, T, accum,
                    describe_kv_shift(run_config(i).model.kv_shift).c_str(), cuda_step.c_str());
      else
        std::printf("%s on %d processes (%s), each on %s (%s), %d x %d tokens x %d accum, kv_shift %s%s\n",
                    a->config.c_str(), r.processes, r.layout.c_str(), device.c_str(), thread_count(threads).c_str(), B,
                    T, accum, describe_kv_shift(run_config(i).model.kv_shift).c_str(), cuda_step.c_str());
      std::printf("median %.2f ms/step (min %.2f, max %.2f over %d steps) | %.0f tokens/s", r.median_ms, r.min_ms,
                  r.max_ms, a->steps, r.tok_s);
      if (r.processes > 1) std::printf(" (%.0f per process)", r.tok_s / r.processes);
      std::printf(" | %.3f model TFLOP/s%s (%s)", r.tflops, r.processes > 1 ? " per process" : "", kFlopsFormula);
      if (r.mfu > 0) std::printf(" | MFU %.1f%% (model TFLOP/s / peak dense bf16)", 100 * r.mfu);
      if (peak.gflops > 0)
        std::printf("\n%.1f%% of the calibrated fp32 SGEMM peak (%.1f GFLOP/s, %s, %s%s; the fastest "
                    "step %.1f%%)",
                    100 * peak_fraction(r), peak.gflops, thread_count(peak.threads).c_str(),
                    peak.cached ? "cached from " : "measured ", peak.cached ? peak.measured_at.c_str() : "now",
                    100 * fastest_fraction(r));
      std::printf("\npeak memory (%s) %.1f MiB", r.peak_what.c_str(), r.peak_mib);
      if (cpu_run)
        std::printf(" | GEMMs: %s, %s%s", cpu::gemm_library_name(run_gemm(i).library, true).c_str(),
                    threading_text(run_gemm(i).library, run_gemm(i).threading),
                    r.replicas > 1 ? fmt::format(" | {} thread replicas", r.replicas).c_str()
                    : threads > 1  ? " | threads sharing each op"
                                   : "");
      std::printf(" | load average %.2f", loadavg_1min());
      if (r.steal) std::printf(" | CPU steal %.1f%% (the hypervisor's share of the timed steps)", 100 * *r.steal);
      std::printf("\n");
      if (!r.gemm_timing.empty()) std::printf("%s\n", r.gemm_timing.c_str());
      if (a->profile) print_profile(r, profile_peak_gflops(r), peak_threads);
      if (peak_fraction(r) > 1.0)
        std::printf("warning: this run beat the calibrated peak, so the calibration was slowed down (other work or "
                    "more threads than cores; load average %.2f at %s): rerun with --recalibrate on an idle "
                    "machine\n",
                    peak.loadavg, peak.measured_at.c_str());
    }
    if (a->compare_shift && a->profile) print_profile_difference(res[0], res[1]);
    if (a->compare_shift)
      std::printf("KV shifting step-time overhead: %+.2f%% (median %.2f vs %.2f ms)\n",
                  100.0 * (res[1].median_ms / res[0].median_ms - 1.0), res[1].median_ms, res[0].median_ms);
    if (a->compare_overlap)
      std::printf("AdamW overlapping the next forward: %.3fx the tokens/s (median %.2f vs %.2f ms after the step)\n",
                  res[0].median_ms / res[1].median_ms, res[1].median_ms, res[0].median_ms);
    if (a->compare_gemm_timing)
      std::printf("Timed GEMM algorithms: %.3fx the tokens/s (median %.2f vs %.2f ms with cuBLASLt's first)\n",
                  res[0].median_ms / res[1].median_ms, res[1].median_ms, res[0].median_ms);
    if (a->compare_gemm)
      std::printf(
          "oneDNN's steps against OpenBLAS's: %.3fx the tokens/s (median %.2f vs %.2f ms, steps alternated)\n",
          res[0].median_ms / res[1].median_ms, res[1].median_ms, res[0].median_ms);
    if (a->compare_replicas)
      std::printf("Thread replicas against threads sharing each op: %.3fx the tokens/s (median %.2f vs %.2f ms, "
                  "steps alternated between two engines)\n",
                  res[0].median_ms / res[1].median_ms, res[1].median_ms, res[0].median_ms);
    if (a->compare_gemm_threads)
      std::printf("GEMMs split over the threads against the library's own threading: %.3fx the tokens/s (median "
                  "%.2f vs %.2f ms, steps alternated)\n",
                  res[0].median_ms / res[1].median_ms, res[1].median_ms, res[0].median_ms);
  });
}

}  // namespace kvs::cli
