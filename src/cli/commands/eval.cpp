#include <cmath>
#include <filesystem>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/tokenizer_check.h"
#include "train/trainer.h"

namespace kvs::cli {

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Validation loss and accuracy of a checkpoint");
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
  cmd->add_option("--set", a->sets, "Override a data or train key (repeatable; the model is the checkpoint's)");
  cmd->add_option("--device", a->device, "cpu or cuda (default: the config's)");
  cmd->add_flag("--json", a->json, "Print one JSON object instead of text");
  cmd->callback([a]() {
    for (const auto& s : a->sets)
      KVS_CHECK(s.rfind("model.", 0) != 0 && s.rfind("model=", 0) != 0,
                "--set {}: eval runs the checkpoint's model as saved; only data and train keys can be overridden", s);
    const std::string dir = resolve_checkpoint_dir(a->checkpoint);
    LoadedCheckpoint ck = read_checkpoint(dir);
    Config cfg;
    if (!a->config.empty()) {
      cfg = load_config(a->config, a->sets);
    } else {
      KVS_CHECK(!ck.data.run_config.is_null(), "{}: no run_config.json; pass --config", dir);
      nlohmann::json j = ck.data.run_config;
      for (const auto& s : a->sets) apply_override(j, s, dir + "/run_config.json");
      cfg = config_from_json(j, dir + "/run_config.json");
      validate(cfg, dir + "/run_config.json");
    }
    // The model is the checkpoint's: its rules (seq_len within max_position_embeddings; on
    // CUDA head_dim, no document masking) apply, not those of --config's model section.
    const std::string origin = a->config.empty() ? dir + "/run_config.json" : a->config;
    if (!a->device.empty()) cfg.device = device_flag(a->device);
    cfg.model = ck.model;
    validate(cfg, origin + " with the model of " + dir + (a->device.empty() ? "" : " and --device " + a->device));
    const std::string cfg_dir =
        cfg.source_path.empty() ? "." : std::filesystem::absolute(cfg.source_path).parent_path().string();
    if (!cfg.data.tokenizer.empty())  // the data's ids must mean what they meant in training
      check_checkpoint_tokenizer(ck.data.trainer_state, dir,
                                 check_data_tokenizer(cfg.data.tokenizer, ck.model.vocab_size, cfg_dir));
    auto data = make_dataset(cfg.data, cfg.train.seq_len, ck.model.vocab_size, cfg.train.seed, cfg_dir);
    auto engine = engine_for(ck, cfg.train.micro_batch_size, cfg.train.seq_len, cfg.device);
    EvalResult r = evaluate(*engine, *data, cfg.train.micro_batch_size, cfg.train.seq_len, cfg.train.eval_sequences);
    KVS_CHECK(r.scored_tokens > 0, "{}: no position of the {} validation sequences is scored (train.seq_len {}); "
              "nothing was evaluated", dir, r.sequences, cfg.train.seq_len);
    KVS_CHECK(std::isfinite(r.loss), "{}: val_loss is {} over {} scored tokens: the model's weights or activations "
              "are not finite", dir, r.loss, r.scored_tokens);
    if (a->json) {
      // accuracy_kind: the accuracy name with '_' for '-' ("induction", "next_token", "3_gram", "hop_k").
      std::string kind = data->accuracy_name();
      for (char& ch : kind)
        if (ch == '-') ch = '_';
      nlohmann::json j = {{"checkpoint", dir},       {"val_loss", r.loss},         {"accuracy", r.accuracy},
                          {"sequences", r.sequences}, {"scored_tokens", r.scored_tokens},
                          {"accuracy_kind", kind}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s: val_loss %.4f | %s accuracy %.2f%% | %lld sequences, %lld scored tokens\n", dir.c_str(), r.loss,
                  data->accuracy_name().c_str(), 100 * r.accuracy,
                  static_cast<long long>(r.sequences), static_cast<long long>(r.scored_tokens));
    }
  });
}

}  // namespace kvs::cli
