#include <cmath>
#include <filesystem>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "cli/commands/world_guard.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/log.h"
#include "core/json_difference.h"
#include "data/dataset.h"
#include "data/tokenizer_check.h"
#include "dist/world.h"
#include "train/model_io.h"
#include "train/rank_agreement.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace kvs::cli {

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Validation loss and accuracy of a checkpoint; under mpirun or torchrun in the config's parallel layout (each "
      "rank reads its part of the weights, the data-parallel replicas split the batches; the numbers are one "
      "process's)");
  struct Args {
    std::string checkpoint, config, device;
    std::vector<std::string> sets;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint (step_* dir), a checkpoints/ dir or a run dir (their latest checkpoint)")
      ->required();
  cmd->add_option("--config", a->config,
                  "Config giving the data and eval settings (default: the checkpoint's run_config.json)");
  cmd->add_option("--set", a->sets,
                  "Override a data, train or parallel key (repeatable; the model is the checkpoint's; parallel.* "
                  "under mpirun or torchrun)");
  cmd->add_option("--device", a->device, "cpu or cuda (default: the config's)");
  cmd->add_flag("--json", a->json, "Print one JSON object instead of text");
  cmd->callback([a]() {
    for (const auto& s : a->sets)
      KVS_CHECK(s.rfind("model.", 0) != 0 && s.rfind("model=", 0) != 0,
                "--set {}: eval runs the checkpoint's model as saved; only data, train and parallel keys can be "
                "overridden",
                s);
    const std::string dir = resolve_checkpoint_dir(a->checkpoint);
    // Opened, not read: each rank reads only its part of the weights.
    const OpenedCheckpoint ck = open_model_checkpoint(dir, /*with_optimizer=*/false);
    Config cfg;
    if (!a->config.empty()) {
      cfg = read_config(a->config, a->sets);  // validated below, with the checkpoint's model
    } else {
      KVS_CHECK(ck.files.run_config_error.empty(), "{}; pass --config", ck.files.run_config_error);
      KVS_CHECK(!ck.files.run_config.is_null(), "{}: no run_config.json; pass --config", dir);
      nlohmann::json j = ck.files.run_config;
      // A value that --set gave is the --set's fault, not the file's: the origin says both.
      std::string origin = dir + "/run_config.json";
      for (size_t i = 0; i < a->sets.size(); ++i) origin += (i ? ", " : " with --set ") + a->sets[i];
      for (const auto& s : a->sets) apply_override(j, s, dir + "/run_config.json");
      cfg = config_from_json(j, origin);
      validate(cfg, origin);
    }
    // Another data section (another file, a --set of data.*) evaluates other text: with another val
    // split (val_fraction, val files) possibly some the run trained on. Allowed, and said.
    // The generated tasks' validation sequences also follow train.seed (docs/DATA.md).
    const nlohmann::json& run = ck.files.run_config;
    std::string data_change;
    if (run.is_object() && run.contains("data") && run["data"].is_object()) {
      // Another task is the difference to name; within one task, only its own section counts
      // (a config made for another task holds other values in sections its type never reads).
      const nlohmann::json now = to_json(with_absolute_paths(cfg))["data"];
      const nlohmann::json run_type = run["data"].value("type", nlohmann::json()), now_type = now["type"];
      auto read_by_type = [](nlohmann::json d) {
        const nlohmann::json type = d.value("type", nlohmann::json());
        for (const auto& [e, name] : enum_names(DatasetType{}))
          if (type != std::string(name)) d.erase(std::string(name));
        return d;
      };
      if (run_type != now_type) data_change = "data.type: " + run_type.dump() + " vs " + now_type.dump();
      else if (const std::string d = json_difference(read_by_type(run["data"]), read_by_type(now)); !d.empty())
        data_change = "data." + d;
    } else if (run.is_object() && run.contains("data")) {
      data_change = "data: " + run["data"].dump() + " vs a data section";  // hand-edited into a non-object
    }
    if (cfg.data.type != DatasetType::Shards && run.is_object() && run.contains("train") && run["train"].contains("seed") &&
        run["train"]["seed"] != to_json(cfg)["train"]["seed"])
      data_change += fmt::format("{}train.seed: {} vs {}", data_change.empty() ? "" : "; ", run["train"]["seed"].dump(),
                                 cfg.train.seed);
    // The model is the checkpoint's: its rules (seq_len within max_position_embeddings; on
    // CUDA head_dim, no document masking) apply, not those of --config's model section.
    const std::string origin = a->config.empty() ? dir + "/run_config.json" : a->config;
    if (!a->device.empty()) cfg.device = device_flag(a->device);
    cfg.model = ck.model;
    validate(cfg, origin + " with the model of " + dir + (a->device.empty() ? "" : " and --device " + a->device));
    const std::string cfg_dir = config_dir(cfg);
    if (!cfg.data.tokenizer.empty())  // the data's ids must mean what they meant in training
      check_checkpoint_tokenizer(ck.files.trainer_state, dir,
                                 check_data_tokenizer(cfg.data.tokenizer, ck.model.vocab_size, cfg_dir));
    // One process evaluates the whole model, whatever layout the run trained in.
    // Under mpirun or torchrun the ranks hold the config's parallel layout (the
    // run's, or --set parallel.*), and the data-parallel replicas split the
    // batches: the numbers are one process's either way (evaluate()).
    auto world = dist::make_world(cfg.device);
    set_log_rank(world->rank());
    if (world->size() == 1) {
      // The run's layout does not apply, but a layout asked for here does: one
      // process cannot hold tp 2, and says so as bench does.
      cfg.parallel = ParallelConfig{};
      nlohmann::json j = to_json(cfg);
      bool asked = false;
      for (const auto& s : a->sets)
        if (s.rfind("parallel.", 0) == 0 || s.rfind("parallel=", 0) == 0) {
          apply_override(j, s, origin);
          asked = true;
        }
      if (asked) cfg.parallel = config_from_json(j, origin).parallel;
    }
    // No optimizer step runs: grad_accum_steps only sizes the pipeline's
    // schedule, so the fewest micro-batches any layout takes.
    const ParallelConfig& p = cfg.parallel;
    const int dp = std::max(1, world->size() / (p.tp * p.cp * p.pp));
    cfg.train.grad_accum_steps = dp * (p.pp > 1 && p.virtual_stages > 1 ? p.pp : 1);
    check_layout_or_exit(world, cfg);
    const bool rank0 = world->rank() == 0;
    if (rank0 && !data_change.empty())
      spdlog::warn("the data settings differ from the run's ({}, run vs now): these validation sequences are "
                   "not the ones the run held out, and may include text it trained on",
                   data_change);
    const int threads = use_threads(cfg.train.threads);  // the run's (or --set's), as train ran its evaluations
    auto data =
        make_dataset(cfg.data, cfg.train.seq_len, ck.model.vocab_size, cfg.train.seed, cfg_dir, document_bos_of(ck.model));
    EvalResult r;
    std::string layout;
    nlohmann::json layout_json;
    run_on_world(*world, [&] {
      check_same_config_on_every_rank(cfg, *world);
      TrainStep step(cfg, *world);
      step.io().check_file(*ck.files.model, {""});
      write_params_in_windows(step.engine(),
                              [&](size_t at, size_t n, float* w) { step.io().read_local(*ck.files.model, "", at, n, w); });
      layout = step.layout();
      layout_json = step.layout_json();
      r = evaluate(step.engine(), *data, cfg.train.micro_batch_size, cfg.train.seq_len, cfg.train.eval_sequences,
                   step.pipeline(), step.groups().pp_comm, step.groups().dp_comm);
      if (!rank0) return;  // every rank has the numbers: rank 0 judges and prints them
      KVS_CHECK(r.scored_tokens > 0, "{}: no position of the {} validation sequences is scored (train.seq_len {}); "
                "nothing was evaluated", dir, r.sequences, cfg.train.seq_len);
      KVS_CHECK(std::isfinite(r.loss), "{}: val_loss is {} over {} scored tokens: the model's weights or activations "
                "are not finite", dir, r.loss, r.scored_tokens);
    });
    if (!rank0) return;
    if (a->json) {
      // accuracy_kind: the accuracy name with '_' for '-' ("induction", "next_token", "3_gram", "hop_k").
      std::string kind = data->accuracy_name();
      for (char& ch : kind)
        if (ch == '-') ch = '_';
      nlohmann::json j = {{"checkpoint", dir},       {"val_loss", r.loss},         {"accuracy", r.accuracy},
                          {"sequences", r.sequences}, {"scored_tokens", r.scored_tokens},
                          {"accuracy_kind", kind},    {"parallel", layout_json}, {"threads", threads}};
      if (!r.sources.empty()) j["sources"] = eval_sources_json(r);
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s: val_loss %.4f | %s accuracy %.2f%% | %lld sequences, %lld scored tokens", dir.c_str(), r.loss,
                  data->accuracy_name().c_str(), 100 * r.accuracy,
                  static_cast<long long>(r.sequences), static_cast<long long>(r.scored_tokens));
      if (r.sequences < cfg.train.eval_sequences)
        std::printf(" (the whole validation split; train.eval_sequences asks for %d)", cfg.train.eval_sequences);
      if (world->size() > 1) std::printf(" | %d processes: %s", world->size(), layout.c_str());
      std::printf("\n");
      for (const EvalResult::Source& src : r.sources)
        std::printf("  %s: val_loss %.4f | accuracy %.2f%% | %lld sequences, %lld scored tokens\n", src.name.c_str(),
                    src.loss, 100 * src.accuracy, static_cast<long long>(src.sequences),
                    static_cast<long long>(src.scored_tokens));
    }
  });
}

}  // namespace kvs::cli
