// `export-hf` and `import-hf`: Hugging Face transformers in and out (docs/HF.md).
#include <cstdio>

#include "cli/commands/commands.h"
#include "cli/commands/common.h"
#include "core/error.h"
#include "hf/export.h"
#include "hf/import.h"
#include "hf/shard_plan.h"

namespace kvs::cli {

void add_export_hf(CLI::App& app) {
  auto* cmd = app.add_subcommand("export-hf", "Write a checkpoint as a Hugging Face transformers model directory");
  struct Args {
    hf::ExportOptions o;
    std::string max_shard = "5GB";
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->o.checkpoint, "Checkpoint: a step dir, a checkpoints/ dir or a run dir")
      ->required();
  cmd->add_option("--out", a->o.out, "Output directory (created; must not exist or be empty unless --force)")
      ->required();
  cmd->add_option("--dtype", a->o.dtype, "Weight dtype of model.safetensors: bf16 (default) or fp32 (lossless)");
  cmd->add_option("--tokenizer", a->o.tokenizer,
                  "Tokenizer directory (tokenizer.model + kvshift_tokenizer.json); default: the run config's "
                  "data.tokenizer");
  cmd->add_option("--max-shard-size", a->max_shard,
                  "Shard model.safetensors above this size (5GB = 5e9 bytes, 2GiB = 2^31), with an index")
      ->capture_default_str();
  cmd->add_flag("--force", a->o.force, "Replace an existing non-empty --out");
  cmd->callback([a]() {
    a->o.max_shard_bytes = hf::parse_size(a->max_shard, "--max-shard-size");
    a->o.checkpoint = resolve_checkpoint_dir(a->o.checkpoint);
    std::printf("%s\n", hf::export_hf(a->o).c_str());
  });
}

void add_import_hf(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "import-hf", "Read a Llama/Mistral-style Hugging Face safetensors model into a kvshift checkpoint directory");
  auto o = std::make_shared<hf::ImportOptions>();
  cmd->add_option("--model", o->model,
                  "Hugging Face model directory: config.json + model.safetensors (or its index and shards)")
      ->required();
  cmd->add_option("--out", o->out, "Output checkpoint directory (config.json + fp32 model.safetensors)")->required();
  cmd->add_option("--kv-shift-init", o->kv_shift_init,
                  "Add KV shift parameters to a model without them: none (keep the model as it is), paper "
                  "(prev ~ U(0,1), cur = 1 - prev, seeded) or identity (prev 0, cur 1: the same function)");
  auto* window = cmd->add_option("--window", o->window,
                                  "Window of the added shift parameters (1, 2 or 3; with --kv-shift-init paper or "
                                  "identity)")
                     ->capture_default_str();
  auto* seed = cmd->add_option("--seed", o->seed, "Seed of --kv-shift-init paper")
                   ->check(kNonNegativeInteger)
                   ->capture_default_str();
  cmd->add_flag("--force", o->force, "Replace an existing non-empty --out");
  cmd->callback([o, window, seed]() {
    // Options of an init that does not run would be ignored: say so instead.
    KVS_CHECK(window->count() == 0 || o->kv_shift_init == "paper" || o->kv_shift_init == "identity",
              "--window: sets the window of added shift parameters: needs --kv-shift-init paper or identity");
    KVS_CHECK(seed->count() == 0 || o->kv_shift_init == "paper",
              "--seed: seeds --kv-shift-init paper; it has no effect with --kv-shift-init {}", o->kv_shift_init);
    std::printf("%s\n", hf::import_hf(*o).c_str());
  });
}

}  // namespace kvs::cli
