// The training loop: global batches of micro-batches with gradient
// accumulation, AdamW with warmup and clipping, periodic evaluation,
// metrics.jsonl, the live progress line and atomic checkpoints.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/engine.h"
#include "train/train_step.h"  // check_parallel_layout

namespace kvs {

class PipelineRunner;

struct EvalResult {
  double loss = 0;           // mean over scored tokens
  double accuracy = 0;       // argmax hits / scored tokens
  int64_t scored_tokens = 0;
  int64_t sequences = 0;
  // stop_requested said yes before the last micro-batch: nothing else in here holds.
  bool abandoned = false;
  // Blended data (Dataset::source_names): each source's part of the same
  // sequences, in the sources' order; empty for a single source.
  struct Source {
    std::string name;
    double loss = 0, accuracy = 0;
    int64_t scored_tokens = 0, sequences = 0;
  };
  std::vector<Source> sources;
};

// Evaluates on the first `max_sequences` validation sequences (fewer if the split is smaller).
// With a pipeline (pipe, the pipeline group pp_comm) every batch goes through
// every stage and the numbers, which the last stage computes, are summed over
// the group, so every rank returns them. With data-parallel replicas (dp_comm)
// replica d evaluates micro-batches d, d + dp, ...; each micro-batch's numbers
// come to every rank and are summed in micro-batch order, so the result is one
// process's, bit for bit.
// stop_requested, when given, is asked before each round of micro-batches (one
// per replica) on every rank, so it must be collective and give every rank the
// same answer; the first yes abandons the evaluation (a stop signal must not
// wait for a long one: docs/RELIABILITY.md "Signals").
EvalResult evaluate(Engine& engine, const Dataset& data, int micro_batch, int seq_len, int64_t max_sequences,
                    PipelineRunner* pipe = nullptr, dist::Communicator* pp_comm = nullptr,
                    dist::Communicator* dp_comm = nullptr, const std::function<bool()>& stop_requested = {});

// Blended data's per-source numbers: {"<name>": {"val_loss", "accuracy",
// "scored_tokens", "sequences"}} for metrics.jsonl and `eval --json`, and
// " | <name> val_loss x.xxxx, ..." for log lines ("" for a single source).
nlohmann::json eval_sources_json(const EvalResult& r);
std::string eval_sources_text(const EvalResult& r);

struct TrainOptions {
  std::string run_dir;
  bool resume = false;
  bool quiet = false;  // no progress line (tests)
  // Every process of the run (dp x tp ranks; docs/PARALLEL.md); null = one process.
  dist::Communicator* comm = nullptr;
  // A fresh run (not resume) starts from this checkpoint's weights instead of
  // the seeded initialisation (continued pretraining, e.g. after import-hf).
  std::string init_from = "";
  // Resume although the training data's sequence count differs from the checkpoint's
  // (shards added or removed, another val split): the data positions then map
  // onto other sequences, which is refused unless this is set.
  bool allow_data_change = false;
};

struct TrainSummary {
  int64_t steps_done = 0;
  std::vector<double> losses;  // train loss of each step run in this call
  EvalResult final_eval;
  std::string last_checkpoint;
  // Set when a stop signal ended the run early, after a checkpoint of the last
  // step (docs/RELIABILITY.md): "SIGTERM", "SIGUSR1", ...
  std::string stopped_by;
};

// Runs (or resumes) training; throws kvs::Error on bad input, and on a
// non-finite loss or gradient norm (naming the step; the last checkpoint is
// left as it was). With opt.comm of size dp > 1 every rank calls this; rank 0
// alone writes metrics, evaluations and checkpoints, and returns the
// evaluations (other ranks' final_eval stays empty).
TrainSummary train(const Config& cfg, const TrainOptions& opt);

// The directory a config's relative paths start from: its file's ("." for one built in code).
std::string config_dir(const Config& c);

// Shard and tokenizer paths are relative to the config file; the copies saved in the run
// directory and in checkpoints must work from anywhere, so they are stored absolute
// (and compared so: eval --config of the run's own file names no difference).
Config with_absolute_paths(const Config& in);

}  // namespace kvs
