#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/commands/world_guard.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/world.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/gemm_library.h"
#include "model/config.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

namespace kvs::cli {

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a JSON config (or resume a run)");
  struct Args {
    std::string config, run_dir, init_from;
    std::vector<std::string> sets;
    bool resume = false, quiet = false, allow_data_change = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--config", a->config,
                  "Experiment config (JSON). With --resume it defaults to RUN_DIR/config.json");
  cmd->add_option("--set", a->sets, "Override a config key, e.g. --set train.lr=3e-4 (repeatable)");
  cmd->add_option("--run-dir", a->run_dir,
                  "Output directory: metrics.jsonl, config.json, checkpoints/ (default runs/<config name>)")
      ->check([](const std::string& v) { return v.empty() ? std::string("an empty path") : std::string(); });
  cmd->add_flag("--resume", a->resume, "Continue from the run directory's latest checkpoint");
  cmd->add_option("--init-from", a->init_from,
                  "Start a new run (step 0, fresh optimizer) from the weights of a checkpoint: a step directory "
                  "(e.g. one written by `kvshift import-hf`), or a run or checkpoints/ directory (its latest); the "
                  "model must match the config's")
      ->excludes("--resume");
  cmd->add_flag("--allow-data-change", a->allow_data_change,
                "With --resume: go on although the training data changed since the checkpoint (its sequence count: "
                "shards added or removed, another val split; the shards' contents; a generated task's settings), or "
                "cannot be compared with it (no run_config.json in the checkpoint); the step's data position may "
                "then map onto other sequences")
      ->needs("--resume");
  cmd->add_flag("--quiet", a->quiet, "No live progress line");
  cmd->callback([a]() {
    std::string config = a->config;
    if (config.empty()) {
      KVS_CHECK(a->resume && !a->run_dir.empty(), "train: --config is required (unless --resume with --run-dir)");
      config = a->run_dir + "/config.json";
    }
    Config cfg = load_config(config, a->sets);
    std::string run_dir = a->run_dir;
    if (run_dir.empty()) {
      const std::string stem = cfg.name.empty() ? std::filesystem::path(config).stem().string() : cfg.name;
      // runs/<name> is one directory under runs/: a name with '/' or "..", or an absolute one, is a path.
      KVS_CHECK(stem != "." && stem != ".." && stem.find('/') == std::string::npos && stem.size() <= 255,
                "{}: name '{}' cannot name a directory under runs/ (no '/', not '.' or '..', at most 255 bytes): change "
                "it or pass --run-dir",
                config, stem);
      run_dir = "runs/" + stem;
    }
    // dp x tp = the number of processes the launcher started (docs/PARALLEL.md,
    // docs/LAUNCH.md); only rank 0 logs, shows the progress line and prints
    // the summary. The device picks the backend (NCCL for cuda under torchrun).
    auto world = dist::make_world(cfg.device);
    const bool rank0 = world->rank() == 0;
    // From here to exit a stop signal is a request (read by train() at step boundaries), not a kill.
    const StopSignals stop_signals(cfg.train.stop_signal, rank0);
    if (!rank0) spdlog::set_level(spdlog::level::warn);
    set_log_rank(world->rank());
    if (rank0 && cfg.device == Device::Cpu) {
      const cpu::BlasChoice& blas = cpu::select_blas_kernels();
      const cpu::GemmLibraryChoice& gemm = cpu::select_gemm_library();
      if (gemm.onednn_failed) spdlog::warn("GEMMs: {}", gemm.describe());
      else spdlog::info("GEMMs: {}", gemm.describe());
      spdlog::info("OpenBLAS kernels: {}", blas.describe());
      if (blas.slow_fallback && cpu::gemm_library() == cpu::GemmLibrary::OpenBLAS)
        spdlog::warn("OpenBLAS runs its generic {} kernels on a CPU with AVX2 or AVX-512: unset OPENBLAS_CORETYPE "
                     "or set it to Haswell/SkylakeX for about 3x faster steps", blas.core);
    }
    check_layout_or_exit(world, cfg);
    TrainSummary s;
    run_on_world(*world, [&] {
      const std::string init_from = a->init_from.empty() ? "" : resolve_checkpoint_dir(a->init_from);
      s = train(cfg, {run_dir, a->resume, a->quiet || !rank0, world.get(), init_from, a->allow_data_change});
    });
    if (!s.stopped_by.empty()) {
      // A stop signal: every rank stopped after the same step, rank 0 wrote the checkpoint.
      if (rank0) {
        std::printf("kvshift: stopped by %s after step %lld; checkpoint %s (continue with --resume)\n",
                    s.stopped_by.c_str(), static_cast<long long>(s.steps_done), s.last_checkpoint.c_str());
        std::fflush(stdout);
      }
      world.reset();
      std::exit(kExitStopped);
    }
    if (rank0 && s.final_eval.scored_tokens > 0)
      std::printf("run %s: %lld steps, val_loss %.4f, accuracy %.2f%%\n", run_dir.c_str(),
                  static_cast<long long>(s.steps_done), s.final_eval.loss, 100 * s.final_eval.accuracy);
    else if (rank0)  // no validation data (the trainer said so when it started): no numbers to show
      std::printf("run %s: %lld steps, not evaluated (no scored validation positions)\n", run_dir.c_str(),
                  static_cast<long long>(s.steps_done));
  });
}

}  // namespace kvs::cli
