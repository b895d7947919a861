#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>

#include "core/blas_address_space.h"
#include "core/cpu_budget.h"
#include "core/dir_lock.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/json_difference.h"
#include "core/memory_budget.h"
#include "core/log.h"
#include "core/profile_range.h"
#include "core/rng.h"
#include "data/tokenizer_check.h"
#include "dist/launch.h"
#include "kernels/cpu/gemm_library.h"
#include "model/cpu_replicas.h"
#include "model/flops.h"
#include "model/params.h"
#include "parallel/parallel_groups.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/zero1.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/tensor_stream.h"
#include "train/full_model_io.h"
#include "train/metrics.h"
#include "train/model_io.h"
#include "train/progress.h"
#include "train/rank_agreement.h"
#include "train/resume_point.h"
#include "train/schedule.h"
#include "train/step_watch.h"
#include "train/stop_signals.h"


namespace kvs {

namespace fs = std::filesystem;

namespace {

// Host-side buffers for one global batch, allocated once.
struct BatchBuffers {
  int sequences = 0, T = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> mask;
  void resize(int n, int seq_len) {
    sequences = n;
    T = seq_len;
    inputs.resize(static_cast<size_t>(n) * seq_len);
    targets.resize(inputs.size());
    mask.resize(inputs.size());
  }
  void fill(const Dataset& d, Split split, uint64_t first_index, int n) {
    for (int i = 0; i < n; ++i) {
      const size_t o = static_cast<size_t>(i) * T;
      d.get(split, first_index + i, inputs.data() + o, targets.data() + o, mask.data() + o);
    }
  }
  Batch micro(int first_seq, int n) const {
    const size_t o = static_cast<size_t>(first_seq) * T;
    return Batch{n, T, inputs.data() + o, targets.data() + o, mask.data() + o};
  }
};

// Where two models differ, as a model-section key ("model.kv_shift.enabled:
// true vs false"); "" if they are the same.
std::string model_difference(const ModelConfig& a, const ModelConfig& b) {
  nlohmann::json ja = model_to_hf_json(a), jb = model_to_hf_json(b);
  for (const char* derived : {"architectures", "head_dim"}) {  // named through what they follow from
    ja.erase(derived);                                          // (kv_shift.enabled; hidden_size, heads)
    jb.erase(derived);
  }
  const std::string d = json_difference(ja, jb);
  return d.empty() ? d : "model." + d;
}

// This rank's slice of checkpoint `dir`'s weights for a fresh run of `model`:
// the architecture must match (training-only keys aside), so must the
// tokenizer (data.tokenizer, when set), and every tensor is checked by name
// and shape.
void initial_weights_from(const std::string& dir, const ModelConfig& model, const std::string& tokenizer,
                          const FullModelIO& io, Engine& engine) {
  const OpenedCheckpoint ck = open_model_checkpoint(dir);
  auto architecture = [](ModelConfig m) {
    m.initializer_range = 0.02;  // how to initialise, when to mask documents: not the weights' meaning
    m.document_boundaries = DocumentBoundaries::None;
    m.bos_token_id = -1;
    return m;
  };
  if (const std::string d = model_difference(architecture(ck.model), architecture(model)); !d.empty())
    fail("--init-from {}: the checkpoint's model differs from the config's model section: {} (checkpoint vs config)",
         dir, d);
  if (!tokenizer.empty()) check_checkpoint_tokenizer(ck.files.trainer_state, dir, tokenizer);
  io.check_file(*ck.files.model, {""});
  write_params_in_windows(engine, [&](size_t at, size_t n, float* w) { io.read_local(*ck.files.model, "", at, n, w); });
}

// How many sequences each split of the data holds, recorded in checkpoints:
// the data position (a sequence index) means the same windows only over the
// same counts. Generated tasks (endless) record nothing.
// Blended data adds each source's train sequences and share: another weight
// sends the same index to another source.
nlohmann::json data_counts(const Dataset& d) {
  nlohmann::json j = nlohmann::json::object();
  for (auto [split, key] : {std::pair{Split::Train, "train_sequences"}, std::pair{Split::Val, "val_sequences"}})
    if (d.size(split) != UINT64_MAX) j[key] = d.size(split);
  if (!d.source_names().empty())
    for (const Dataset::Use& u : d.train_use(1.0))
      j["sources"].push_back({{"train_sequences", u.sequences}, {"share", u.reads}});
  return j;
}

// What the splits are made of (Dataset::content_id): shards whose contents
// changed under the same counts (re-prepared from other text, another
// directory's) would otherwise pass the counts' comparison. Generated tasks: {}.
nlohmann::json data_contents(const Dataset& d) {
  nlohmann::json j = nlohmann::json::object();
  for (auto [split, key] : {std::pair{Split::Train, "train"}, std::pair{Split::Val, "val"}})
    if (const std::string id = d.content_id(split); !id.empty()) j[key] = id;
  return j;
}

// What of data_counts() training reads (all but the validation count).
nlohmann::json train_counts(nlohmann::json counts) {
  counts.erase("val_sequences");
  return counts;
}

// A fresh run writes config.json and metrics.jsonl into its directory: never
// over a checkpoint's or a Hugging Face model's (a path meant for --init-from).
// An earlier run's files are the run's to replace.
void check_fresh_run_directory(const std::string& run_dir) {
  std::error_code ec;
  std::vector<std::string> weights;
  for (const auto& e : fs::directory_iterator(run_dir, ec))
    if (e.path().extension() == ".safetensors" || e.path().extension() == ".bin")
      weights.push_back(e.path().filename().string());
  std::sort(weights.begin(), weights.end());
  KVS_CHECK(weights.empty(),
            "{}: holds model weights ({}); a run there would overwrite its config.json: use another --run-dir "
            "(--init-from {} starts a run from those weights)",
            run_dir, weights.empty() ? "" : weights[0], run_dir);
  const std::string config = run_dir + "/config.json";
  if (!fs::exists(config)) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(config));
  } catch (const nlohmann::json::exception&) {
  }
  KVS_CHECK(j.is_object() && j.contains("train"),
            "{}: not a kvshift run's config (no 'train' section); a new run would overwrite it: use another "
            "--run-dir",
            config);
}

// Nor over an earlier run's checkpoints (--resume continues them). An earlier
// run that stopped before its first checkpoint (a job killed and started
// again, the same command run twice) left its metrics.jsonl and config.json:
// rank 0 keeps them beside the new run's, as metrics.earlier-N.jsonl and
// config.earlier-N.json (the first free N), and says so. A file without a
// line of a step (a failed start's) is simply replaced.
void keep_earlier_run_record(const std::string& run_dir, bool rank0) {
  const std::string root = run_dir + "/checkpoints";
  if (has_checkpoints(root)) {
    KVS_CHECK(!list_checkpoints(root).empty(),
              "{}/latest is all that is left of the run's checkpoints (no step directory): remove it to start a new "
              "run in {}, or restore the checkpoints and use --resume",
              root, run_dir);
    fail("{}: the run directory already has checkpoints; use --resume or another --run-dir", run_dir);
  }
  const std::string metrics = run_dir + "/metrics.jsonl";
  const MetricsSteps earlier = metrics_steps(metrics);
  if (earlier.lines == 0 || !rank0) return;
  auto kept = [&](int n, const char* stem, const char* ext) { return fmt::format("{}/{}.earlier-{}.{}", run_dir, stem, n, ext); };
  int n = 1;
  while (fs::exists(kept(n, "metrics", "jsonl")) || fs::exists(kept(n, "config", "json"))) ++n;
  std::error_code ec;
  fs::rename(metrics, kept(n, "metrics", "jsonl"), ec);
  KVS_CHECK(!ec, "{}: could not keep an earlier run's metrics as {}: {}", metrics, kept(n, "metrics", "jsonl"),
            ec.message());
  const bool config = fs::exists(run_dir + "/config.json");
  if (config) {
    fs::rename(run_dir + "/config.json", kept(n, "config", "json"), ec);
    KVS_CHECK(!ec, "{}/config.json: could not keep an earlier run's config as {}: {}", run_dir,
              kept(n, "config", "json"), ec.message());
  }
  spdlog::warn("{}: an earlier run without checkpoints left {} metrics lines (up to step {}): kept as {}{}", run_dir,
               earlier.lines, earlier.last, fs::path(kept(n, "metrics", "jsonl")).filename().string(),
               config ? fmt::format(", its config as {}", fs::path(kept(n, "config", "json")).filename().string())
                      : std::string());
}

// A run directory this call creates is removed again if the run fails before
// writing anything into it (a bad data path, a model too large), with the
// parents the call created for it (--run-dir new/a/b): an error leaves no
// empty directory behind to be taken for a run.
class RemovedIfLeftEmpty {
 public:
  explicit RemovedIfLeftEmpty(const std::string& dir) {
    // The directories that do not exist yet, innermost first.
    fs::path p = fs::absolute(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // a trailing '/'
    for (; !fs::exists(p) && p != p.parent_path(); p = p.parent_path()) created_.push_back(p);
  }
  ~RemovedIfLeftEmpty() {
    if (std::uncaught_exceptions() == 0) return;
    std::error_code ec;
    for (const fs::path& p : created_)
      if (!fs::is_empty(p, ec) || ec || !fs::remove(p, ec)) break;
  }
  RemovedIfLeftEmpty(const RemovedIfLeftEmpty&) = delete;
  RemovedIfLeftEmpty& operator=(const RemovedIfLeftEmpty&) = delete;

 private:
  std::vector<fs::path> created_;
};

// KVS_FAULT_INF_GRADIENT_STEP=N (the tests only; docs/RELIABILITY.md): step
// N's gradient scale is +inf on the last data-parallel rank, so the engines'
// own backward makes its gradients non-finite (inf, and NaN where inf meets 0
// or -inf) while the loss (which does not depend on the scale) stays finite:
// the run must stop on the gradient norm, every rank at once. (NaN would not
// do: engines read a negative or NaN scale as "no backward".)
int64_t inf_gradient_fault_step() {
  const char* v = std::getenv("KVS_FAULT_INF_GRADIENT_STEP");
  return v && *v ? std::atoll(v) : 0;
}

}  // namespace

std::string config_dir(const Config& c) {
  if (c.source_path.empty()) return ".";
  return fs::absolute(c.source_path).parent_path().string();
}

Config with_absolute_paths(const Config& in) {
  Config c = in;
  const fs::path dir = config_dir(in);
  for (auto* list : {&c.data.shards.train, &c.data.shards.val})
    for (auto& p : *list)
      if (!fs::path(p).is_absolute()) p = (dir / p).lexically_normal().string();
  if (!c.data.tokenizer.empty() && !fs::path(c.data.tokenizer).is_absolute())
    c.data.tokenizer = (dir / c.data.tokenizer).lexically_normal().string();
  return c;
}

EvalResult evaluate(Engine& engine, const Dataset& data, int micro_batch, int seq_len, int64_t max_sequences,
                    PipelineRunner* pipe, dist::Communicator* pp_comm, dist::Communicator* dp_comm,
                    const std::function<bool()>& stop_requested) {
  EvalResult r;
  const uint64_t available = data.size(Split::Val);
  const int64_t n = static_cast<int64_t>(std::min<uint64_t>(available, static_cast<uint64_t>(max_sequences)));
  KVS_CHECK(n > 0, "evaluation: the validation split is empty (data.shards.val, or data.shards.val_fraction of the "
                   "training shards)");
  BatchBuffers buf;
  buf.resize(micro_batch, seq_len);
  std::vector<float> losses(static_cast<size_t>(micro_batch) * seq_len);
  std::vector<int32_t> argmax(losses.size());
  const bool outputs_here = !pipe || pipe->holds_loss();
  // Per micro-batch: its loss sum and argmax hits (the last stage's), its scored tokens. Zeros for
  // the micro-batches other replicas evaluate: summed over them, each entry is exactly one rank's.
  const int64_t K = (n + micro_batch - 1) / micro_batch;
  const int D = dp_comm ? dp_comm->size() : 1, d = dp_comm ? dp_comm->rank() : 0;
  std::vector<double> loss(K, 0.0), hits(K, 0.0), scored(K, 0.0);
  // Blended data: the same per micro-batch and source, [loss | hits | scored] x [K][S], from the
  // per-token outputs (so the total above keeps the engine's own sum, bit for bit).
  const std::vector<std::string> names = data.source_names();
  const size_t S = names.size();
  std::vector<double> by_source(3 * static_cast<size_t>(K) * S, 0.0);
  double* src_loss = by_source.data();
  double* src_hits = src_loss + K * S;
  double* src_scored = src_hits + K * S;
  // Round by round, so every rank asks stop_requested the same number of times
  // (the last round leaves some replicas without a micro-batch).
  for (int64_t round = 0; round * D < K; ++round) {
    if (stop_requested && stop_requested()) {
      r.abandoned = true;
      return r;
    }
    const int64_t k = round * D + d;
    if (k >= K) continue;
    const int64_t first = k * micro_batch;
    const int b = static_cast<int>(std::min<int64_t>(micro_batch, n - first));
    buf.fill(data, Split::Val, first, b);
    Batch batch = buf.micro(0, b);
    loss[k] = pipe ? pipe->evaluate(engine, batch, losses.data(), argmax.data())
                   : engine.forward(batch, losses.data(), argmax.data(), nullptr);
    for (int j = 0; j < b; ++j) {
      const size_t at = S ? static_cast<size_t>(k) * S + data.source_of(Split::Val, first + j) : 0;
      for (size_t i = static_cast<size_t>(j) * seq_len; i < static_cast<size_t>(j + 1) * seq_len; ++i) {
        if (batch.mask[i] == 0.0f) continue;
        const bool hit = argmax[i] == batch.targets[i];
        ++scored[k];
        if (outputs_here) hits[k] += hit;
        if (!S) continue;
        ++src_scored[at];
        if (outputs_here) src_loss[at] += losses[i], src_hits[at] += hit;
      }
    }
  }
  if (pipe) {  // the last stage's numbers on every stage
    pp_comm->all_reduce(loss.data(), K, dist::DType::F64, dist::ReduceOp::Sum);
    pp_comm->all_reduce(hits.data(), K, dist::DType::F64, dist::ReduceOp::Sum);
    if (S) pp_comm->all_reduce(by_source.data(), 2 * K * S, dist::DType::F64, dist::ReduceOp::Sum);  // not scored
  }
  if (D > 1) {  // every replica's micro-batches on every replica
    for (std::vector<double>* v : {&loss, &hits, &scored})
      dp_comm->all_reduce(v->data(), K, dist::DType::F64, dist::ReduceOp::Sum);
    if (S) dp_comm->all_reduce(by_source.data(), by_source.size(), dist::DType::F64, dist::ReduceOp::Sum);
  }
  double loss_sum = 0;  // in micro-batch order, as one process sums
  int64_t hit_sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    loss_sum += loss[k];
    hit_sum += static_cast<int64_t>(hits[k]);
    r.scored_tokens += static_cast<int64_t>(scored[k]);
  }
  r.sequences = n;
  r.loss = r.scored_tokens ? loss_sum / r.scored_tokens : NAN;
  r.accuracy = r.scored_tokens ? static_cast<double>(hit_sum) / r.scored_tokens : NAN;
  for (size_t s = 0; s < S; ++s) {
    EvalResult::Source e;
    e.name = names[s];
    double l = 0, h = 0;
    for (int64_t k = 0; k < K; ++k) {
      l += src_loss[k * S + s];
      h += src_hits[k * S + s];
      e.scored_tokens += static_cast<int64_t>(src_scored[k * S + s]);
    }
    for (int64_t i = 0; i < n; ++i) e.sequences += data.source_of(Split::Val, static_cast<uint64_t>(i)) == s;
    e.loss = e.scored_tokens ? l / e.scored_tokens : NAN;
    e.accuracy = e.scored_tokens ? h / e.scored_tokens : NAN;
    r.sources.push_back(e);
  }
  return r;
}

nlohmann::json eval_sources_json(const EvalResult& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const EvalResult::Source& s : r.sources)
    j[s.name] = {{"val_loss", s.loss},
                 {"accuracy", s.accuracy},
                 {"scored_tokens", s.scored_tokens},
                 {"sequences", s.sequences}};
  return j;
}

std::string eval_sources_text(const EvalResult& r) {
  std::string t;
  for (size_t i = 0; i < r.sources.size(); ++i)
    t += fmt::format("{} {} val_loss {:.4f}", i ? "," : " |", r.sources[i].name, r.sources[i].loss);
  return t;
}

TrainSummary train(const Config& config, const TrainOptions& opt) {
  const Config cfg = with_absolute_paths(config);
  const TrainConfig& tc = cfg.train;
  KVS_CHECK(!opt.run_dir.empty(), "train: no run directory given");
  std::unique_ptr<dist::Communicator> own_comm;
  dist::Communicator* comm = opt.comm;
  if (!comm) {
    own_comm = dist::make_single_process();
    comm = own_comm.get();
  }
  check_parallel_layout(cfg, comm->size());
  check_same_config_on_every_rank(config, *comm);
  // How the run starts is every rank's too: --resume or --init-from on one side of a launch only would train
  // a mix of two models (or meet another rank in another collective).
  const std::string start = opt.resume ? "--resume" : opt.init_from.empty() ? "a fresh start" : "--init-from";
  KVS_CHECK(same_on_every_rank(hash_name(start), *comm),
            "rank {}/{}: the ranks were started differently (this rank: {}): give every rank the same --resume and "
            "--init-from",
            comm->rank(), comm->size(), start);
  const int rank = comm->rank();
  const bool rank0 = rank == 0;
  use_threads(tc.threads);
  const RemovedIfLeftEmpty created_dir(opt.run_dir);
  make_dirs(opt.run_dir);
  // Rank 0 writes the directory, so rank 0 holds it (released before created_dir looks at it).
  std::optional<DirLock> run_dir_lock;
  if (rank0) run_dir_lock.emplace(opt.run_dir);
  if (!opt.resume) {
    check_fresh_run_directory(opt.run_dir);
    keep_earlier_run_record(opt.run_dir, rank0);
  }
  const std::string ckpt_root = opt.run_dir + "/checkpoints";
  const RemovedIfLeftEmpty created_ckpt_root(ckpt_root);  // before created_dir looks at the run directory
  if (rank0) check_checkpoint_root_writable(ckpt_root);   // now, not at the first save after hours of training

  auto data = make_dataset(cfg.data, tc.seq_len, cfg.model.vocab_size, tc.seed, config_dir(cfg),
                           document_bos_of(cfg.model));
  // The groups, this rank's part of the model and its engine (docs/PARALLEL.md).
  const ProcessMemory before_engine = process_memory();
  TrainStep train_step(cfg, *comm);
  const ParallelGroups& groups = train_step.groups();
  dist::Communicator& dp_comm = *groups.dp_comm;
  Engine* const engine = &train_step.engine();
  PipelineRunner* const pipe = train_step.pipeline();
  const FullModelIO& io = train_step.io();
  const size_t local_floats = engine->layout().total;
  // Recorded in every checkpoint: what reads its ids later must use the same tokenizer.
  const std::string tokenizer_sha = cfg.data.tokenizer.empty() ? "" : tokenizer_sha256(cfg.data.tokenizer);

  // ZeRO-1: from here on the engine keeps the moments of its shard only, and
  // with train.shard_master its fp32 master's (set before any are written or
  // allocated: neither exists whole on the device), and a resumed rank reads
  // only its shard's moments.
  train_step.shard_optimizer();
  Zero1* const zero1 = train_step.zero1();

  // Fresh start or resume (from the newest checkpoint that verifies).
  int64_t step = 0;
  std::optional<OpenedCheckpoint> resumed;  // its moments are read once ZeRO-1 has set this rank's shard
  if (opt.resume) {
    const OpenedCheckpoint& ck = resumed.emplace(find_resume_checkpoint(ckpt_root, *comm));
    const std::string latest = ck.dir;
    ModelConfig resumed_model = ck.model;
    resumed_model.initializer_range = cfg.model.initializer_range;  // how to initialise: the weights exist already
    if (const std::string d = model_difference(resumed_model, cfg.model); !d.empty())
      fail("{}: the checkpoint's model differs from the config's model section: {} (checkpoint vs config)", latest,
           d);
    // (find_resume_checkpoint took one with an optimizer and a trainer state.)
    if (!cfg.data.tokenizer.empty()) check_checkpoint_tokenizer(ck.files.trainer_state, latest, cfg.data.tokenizer);
    io.check_file(*ck.files.model, {""});
    io.check_file(*ck.files.optimizer, {"exp_avg.", "exp_avg_sq."});
    write_params_in_windows(*engine,
                            [&](size_t at, size_t n, float* w) { io.read_local(*ck.files.model, "", at, n, w); });
    const auto& ts = ck.files.trainer_state;
    KVS_CHECK(ts.contains("step") && ts["step"].is_number_integer() && ts["step"].get<int64_t>() >= 0,
              "{}/trainer_state.json: 'step' must be a non-negative integer, got {}", latest,
              ts.contains("step") ? ts["step"].dump() : "none");
    step = ts["step"].get<int64_t>();
    KVS_CHECK(ts.value("global_batch_sequences", -1) == cfg.global_batch_sequences(),
              "{}: the global batch changed (checkpoint {} sequences, config {}); data positions would not line up",
              latest, ts.value("global_batch_sequences", -1), cfg.global_batch_sequences());
    KVS_CHECK(ts.value("seed", tc.seed + 1) == tc.seed,
              "{}: train.seed changed (checkpoint {}, config {}); the data stream would not line up", latest,
              ts.value("seed", uint64_t{0}), tc.seed);
    // The data positions are sequence indices: another window length or data
    // source would map them onto other tokens.
    // They are in run_config.json only (outside the manifest: a copy for reference): one broken or
    // gone (a sync tool driven by the manifest leaves it out) leaves them unchecked.
    const nlohmann::json& was = ck.files.run_config;
    const bool comparable = was.is_object() && was.contains("train") && was["train"].is_object() &&
                            was["train"].contains("seq_len") && was.contains("data") && was["data"].is_object() &&
                            was["data"].contains("type");
    if (!ck.files.run_config_error.empty() || !comparable) {
      const std::string why = !ck.files.run_config_error.empty() ? ck.files.run_config_error
                            : was.is_null()    ? latest + "/run_config.json is missing"
                            : was.is_object()  ? latest + "/run_config.json has no train.seq_len or no data.type"
                                               : latest + "/run_config.json is not a JSON object";
      KVS_CHECK(opt.allow_data_change,
                "{}: train.seq_len and the data settings cannot be compared with the checkpoint's; restore it (every "
                "checkpoint of the run holds the run's config), or pass --allow-data-change to go on unchecked",
                why);
      if (rank0)
        spdlog::warn("{}: train.seq_len and the data settings are not compared with the checkpoint's "
                     "(--allow-data-change)",
                     why);
    }
    if (was.is_object() && was.contains("train") && was["train"].contains("seq_len"))
      KVS_CHECK(was["train"]["seq_len"] == tc.seq_len,
                "{}: train.seq_len changed (checkpoint {}, config {}); the data stream would not line up", latest,
                was["train"]["seq_len"].dump(), tc.seq_len);
    if (was.is_object() && was.contains("data") && was["data"].contains("type")) {
      const nlohmann::json type = to_json(cfg)["data"]["type"];
      KVS_CHECK(was["data"]["type"] == type,
                "{}: data.type changed (checkpoint {}, config {}); the data stream would not line up", latest,
                was["data"]["type"].dump(), type.dump());
      // A generated task's settings (token ranges, pool, 3-gram table, k) decide
      // what each sequence index holds, as the shards' contents do below.
      const std::string task = type.get<std::string>();
      const nlohmann::json now_task = to_json(cfg)["data"].value(task, nlohmann::json());
      if (task != "shards" && was["data"].contains(task) && was["data"][task] != now_task) {
        const std::string what = fmt::format("{}: data.{}.{} (checkpoint vs config)", latest, task,
                                             json_difference(was["data"][task], now_task));
        KVS_CHECK(opt.allow_data_change,
                  "{}; its data position would map onto other sequences: restore the checkpoint's setting, or "
                  "pass --allow-data-change to go on with this one",
                  what);
        if (rank0) spdlog::warn("{}; going on with these (--allow-data-change)", what);
      }
    }
    // Shards added to (or gone from) the train globs, or another val split,
    // map every later index onto other windows (and old val text into
    // training). Only the val files changing leaves training as it was: the
    // evaluations before and after just measure other text.
    // Other validation data only is a warning; other training data is refused unless allowed.
    auto judge_data_change = [&](const std::string& what, bool val_only, const char* val_note, const char* onto,
                                 const char* restore) {
      if (val_only) {
        if (rank0) spdlog::warn("{}{}; its losses before and after are not comparable", what, val_note);
        return;
      }
      KVS_CHECK(opt.allow_data_change,
                "{}; its data position would map onto other {}: restore {}, or pass --allow-data-change to go on "
                "with these",
                what, onto, restore);
      if (rank0) spdlog::warn("{}; going on with these (--allow-data-change)", what);
    };
    const nlohmann::json was_data = ts.value("data", nlohmann::json::object()), now_data = data_counts(*data);
    // What the splits are made of (checkpoints before 2026-11-30 record none).
    const nlohmann::json was_contents = ts.value("data_contents", nlohmann::json::object()),
                         now_contents = data_contents(*data);
    const bool contents_known = was_contents.is_object() && was_contents.contains("train");
    const bool train_text_changed = contents_known && was_contents.value("train", "") != now_contents.value("train", "");
    if (was_data.is_object() && !was_data.empty() && was_data != now_data) {
      judge_data_change(fmt::format("{}: the data changed since this checkpoint (sequences {} then, {} now)", latest,
                                    was_data.dump(), now_data.dump()),
                        train_counts(was_data) == train_counts(now_data) && !train_text_changed,
                        ": the validation data only", "sequences", "the shards and settings it was trained on");
    } else if (contents_known && was_contents != now_contents) {
      // The same counts over other contents.
      const bool train_same = !train_text_changed;
      judge_data_change(
          fmt::format("{}: the {} data changed since this checkpoint: the same {} sequences, but other shards or "
                      "other tokens in them (their manifests' sha256s or names and sizes differ)",
                      latest, train_same ? "validation" : "training",
                      was_data.value(train_same ? "val_sequences" : "train_sequences", nlohmann::json()).dump()),
          train_same, "", "text", "the shards it was trained on");
    }
    KVS_CHECK(step <= tc.steps,
              "{}: the checkpoint is at step {}, past train.steps ({}); raise train.steps to train on", latest, step,
              tc.steps);
    // Training keys may change on a resume (a longer run, another learning rate, a re-layout), and
    // the schedule follows the new ones from this step on: say which changed, and the next rate
    // (after the refusals above, so that a refused change is not first listed as taken).
    if (rank0 && was.is_object() && was.contains("train") && was["train"].is_object()) {
      const nlohmann::json now = to_json(cfg)["train"];
      std::string changed;
      for (const auto& [key, value] : now.items())
        if (was["train"].value(key, nlohmann::json()) != value)
          changed += fmt::format("{}train.{} {} -> {}", changed.empty() ? "" : ", ", key,
                                 was["train"].contains(key) ? was["train"][key].dump() : "(default)", value.dump());
      for (const auto& [key, value] : was["train"].items())
        if (!now.contains(key)) changed += fmt::format("{}train.{} {} -> (default)", changed.empty() ? "" : ", ", key,
                                                       value.dump());
      if (!changed.empty() && step < tc.steps)
        spdlog::warn("resuming with training settings other than the checkpoint's: {}; the learning rate of step {} "
                     "is {:.4g} under them",
                     changed, step + 1, learning_rate(tc, step));
      else if (!changed.empty())
        spdlog::warn("resuming with training settings other than the checkpoint's: {} (no step is left to train)",
                     changed);
    }
    if (rank0) spdlog::info("resuming from {} (step {})", latest, step);
  } else {
    // Each rank makes its slice of the full model's values, so every layout starts from the same weights.
    if (opt.init_from.empty()) {
      write_params_in_windows(*engine, [&](size_t at, size_t n, float* w) { io.init_local(tc.seed, at, n, w); });
    } else {
      KVS_CHECK(same_on_every_rank(checkpoint_identity(opt.init_from), *comm),
                "rank {}/{}: --init-from {}: the ranks were given different checkpoints (or copies that differ): "
                "give every rank the same --init-from",
                comm->rank(), comm->size(), opt.init_from);
      initial_weights_from(opt.init_from, cfg.model, cfg.data.tokenizer, io, *engine);
      if (rank0) spdlog::info("weights from {}", opt.init_from);
    }
  }
  if (resumed) {
    const size_t held_begin = zero1 ? zero1->shard().begin : 0, held_end = zero1 ? zero1->shard().end : local_floats;
    std::vector<float> exp_avg_sq(std::min(kWindowFloats, held_end - held_begin));
    in_windows(held_begin, held_end, [&](size_t at, size_t n, float* exp_avg) {
      io.read_local(*resumed->files.optimizer, "exp_avg.", at, n, exp_avg);
      io.read_local(*resumed->files.optimizer, "exp_avg_sq.", at, n, exp_avg_sq.data());
      engine->write_optimizer_range(at, n, exp_avg, exp_avg_sq.data());
    });
    resumed.reset();  // the files closed
  }
  engine->reserve_optimizer_state();
  // OpenBLAS's GEMM threads map their buffers at their first product, and
  // spin where an address-space limit leaves no room: one line instead.
  if (cfg.device == Device::Cpu && cpu::gemm_library() == cpu::GemmLibrary::OpenBLAS)
    check_address_space_for_openblas_calls(resolve_threads(tc.threads));
  if (rank0 && cfg.device == Device::Cpu) {
    // Allocated is not resident: the gradients, moments and activations are
    // written by the first step, where overcommit would kill a run that does
    // not fit. (The engine's reserved memory the weights have not touched.)
    const ProcessMemory now = process_memory();
    const uint64_t reserved = now.reserved > before_engine.reserved ? now.reserved - before_engine.reserved : 0;
    const uint64_t touched = now.resident > before_engine.resident ? now.resident - before_engine.resident : 0;
    if (const std::string w = memory_shortfall(reserved > touched ? reserved - touched : 0,
                                               dist::detect_launch().local_world_size, memory_available_bytes());
        !w.empty())
      spdlog::warn("{}", w);
  }
  MetricsWriter metrics;
  if (rank0) {
    write_json_file(opt.run_dir + "/config.json", to_json(cfg));
    metrics.open(opt.run_dir + "/metrics.jsonl", opt.resume ? step : 0);
    spdlog::info("parallel layout: {}, backend {}{}{}", train_step.layout(), comm->backend(),
                 !zero1                    ? ""
                 : zero1->master_sharded() ? ", ZeRO-1 optimizer shards (fp32 master sharded too)"
                                           : ", ZeRO-1 optimizer shards",
                 groups.tp > 1 ? fmt::format(", vocabulary padded to {}", padded_vocab(cfg.model, groups.tp)) : "");
  }

  const ParamCounts counts = count_params(cfg.model);
  if (rank0)
    spdlog::info("model: {} params ({} non-embedding), kv_shift {}; data: {}; device {}; {}{}",
               format_count(counts.total), format_count(counts.non_embedding),
               describe_kv_shift(cfg.model.kv_shift), data->describe(), cfg.device,
               thread_count(resolve_threads(tc.threads)), replicas_note(train_step.engine()));
  if (rank0 && tc.warmup_steps > tc.steps && tc.lr > 0)  // allowed (a run to be continued), rarely meant
    spdlog::warn("train.warmup_steps {} is more than train.steps {}: the learning rate rises to {:.4g} ({:.0f}% of "
                 "train.lr) and the run ends before it decays",
                 tc.warmup_steps, tc.steps, learning_rate(tc, tc.steps - 1),
                 100 * learning_rate(tc, tc.steps - 1) / tc.lr);
  // Past one epoch the data repeats (each epoch in another order: docs/DATA.md); say so once.
  if (const double reads = static_cast<double>(tc.steps) * cfg.global_batch_sequences();
      rank0 && data->size(Split::Train) != UINT64_MAX) {
    std::string line = fmt::format("train.steps x the global batch reads {:.0f} sequences:", reads);
    bool repeats = false;
    const std::vector<Dataset::Use> uses = data->train_use(reads);
    for (size_t i = 0; i < uses.size(); ++i) {
      const Dataset::Use& u = uses[i];
      const double epochs = u.reads / static_cast<double>(u.sequences);
      repeats = repeats || epochs > 1;
      line += u.source.empty() ? fmt::format(" {:.3g} epochs of the training data's {} sequences", epochs, u.sequences)
                               : fmt::format("{} {:.0f} from {}, {:.3g} epochs of its {} sequences", i ? ";" : "",
                                             u.reads, u.source, epochs, u.sequences);
    }
    if (repeats)
      spdlog::warn("{} (it repeats, each epoch in another order)", line);
    else
      spdlog::info("{}", line);
  }
  if (rank0 && tc.threads == 0 && !process_cpu_budget().note().empty()) spdlog::info("{}", process_cpu_budget().note());
  if (rank0 && !process_cpu_budget().oversubscribed(tc.threads).empty())
    spdlog::warn("{}", process_cpu_budget().oversubscribed(tc.threads));

  const int GB = cfg.global_batch_sequences(), MB = tc.micro_batch_size, T = tc.seq_len;
  const int LB = train_step.replica_sequences();  // [dp_rank * LB, (dp_rank + 1) * LB) of each global batch
  BatchBuffers batch;
  batch.resize(LB, T);
  TrainSummary summary;
  ProgressLine progress(tc.steps, step);
  double last_eval_acc = NAN;  // the last evaluation's accuracy, at last_eval_step
  int64_t last_eval_step = 0;
  const bool has_val = data->size(Split::Val) > 0;
  if (!has_val && rank0) spdlog::warn("the data have no validation split: evaluation is skipped");
  if (has_val && rank0 && data->size(Split::Val) < static_cast<uint64_t>(tc.eval_sequences))
    spdlog::warn("train.eval_sequences is {}, but the validation split holds {} sequences: each evaluation uses "
                 "those",
                 tc.eval_sequences, data->size(Split::Val));
  // docs/RELIABILITY.md: stop signals, checkpoint writes (async, retention), slow-step reports.
  StopSignals stop_signals(tc.stop_signal, rank0);
  CheckpointWriter writer(ckpt_root, tc.keep_checkpoints, tc.async_checkpoint);
  // A rank's work is compared with its pipeline stage's ranks
  // (rank = ((dp_rank pp + pp_rank) cp + cp_rank) tp + tp_rank, docs/PARALLEL.md).
  std::vector<int> stage_of_rank(static_cast<size_t>(comm->size()));
  for (int r = 0; r < comm->size(); ++r)
    stage_of_rank[static_cast<size_t>(r)] = r / (groups.cp * groups.tp) % groups.pp;
  StepWatch watch(*comm, tc.straggler_factor, rank0 ? &metrics : nullptr, stage_of_rank);

  // What world rank 0 holds of a checkpoint not yet written: three fp32 copies of the model.
  const uint64_t checkpoint_buffer = tc.checkpoint_buffer_bytes(3 * sizeof(float) * io.full_layout().total);
  auto save = [&](int64_t done) {
    // One format whatever the layout: rank 0 writes full tensors, so the ZeRO-1
    // shards (over dp), then the tensor-parallel slices and the stages' tensors
    // are gathered, tensor by tensor, and streamed into rank 0's writer, which
    // holds at most checkpoint_buffer bytes not yet written (docs/PARALLEL.md).
    std::shared_ptr<TensorStream> stream;
    if (rank0) {
      CheckpointData cd;  // the tensors' headers; their bytes follow through the stream
      cd.model = io.full_headers("");
      cd.optimizer = io.full_headers("exp_avg.");
      for (StTensor& t : io.full_headers("exp_avg_sq.")) cd.optimizer.push_back(std::move(t));
      cd.hf_config = model_to_hf_json(cfg.model);
      cd.run_config = to_json(cfg);
      cd.trainer_state = {{"step", done},
                          {"next_train_sequence", static_cast<uint64_t>(done) * GB},
                          {"global_batch_sequences", GB},
                          {"seed", tc.seed},
                          {"data", data_counts(*data)},
                          {"data_contents", data_contents(*data)},
                          {"rng", {{"kind", "counter"}, {"seed", tc.seed}, {"position", static_cast<uint64_t>(done) * GB}}}};
      if (!tokenizer_sha.empty()) cd.trainer_state["tokenizer_sha256"] = tokenizer_sha;
      stream = writer.save_streamed(done, std::move(cd), checkpoint_buffer);  // after the write in flight
    }
    auto keep = [&](StTensor t) {  // gather_full calls it on world rank 0 alone
      KVS_CHECK(stream, "internal error: a checkpoint tensor was kept on rank {}, not rank 0", rank);
      stream->push(std::move(t));
    };
    // Each local tensor is read off the engine when gather_full asks for it:
    // no rank holds a copy of its slice, nor of its replica's moments.
    std::vector<float> tensor;
    try {
      // The other replicas have nothing to add but their ZeRO-1 shards: of
      // the moments below, and of the fp32 master when it is sharded.
      const bool master_shards = zero1 && zero1->master_sharded();
      auto params = [&](const ParamTensor& l) {
        tensor.resize(l.numel);
        if (master_shards)  // a collective over the replicas, like the moments'
          zero1->gather_params_range(l.offset, l.numel, tensor.data());
        else
          engine->read_params_range(l.offset, l.numel, tensor.data());
        return static_cast<const float*>(tensor.data());
      };
      if (io.gathers())
        io.gather_full(params, "", keep);
      else if (master_shards)  // the same collectives, in the order the gathering replica's rank asks
        for (const ParamTensor* l : io.owned_local()) params(*l);
      for (const bool second : {false, true}) {  // exp_avg, then exp_avg_sq
        auto moments = [&](const ParamTensor& l) {
          tensor.resize(l.numel);
          float* m = second ? nullptr : tensor.data();
          float* v = second ? tensor.data() : nullptr;
          if (zero1)  // a collective over the replicas: each part from the shard that holds it
            zero1->gather_optimizer_range(l.offset, l.numel, m, v);
          else
            engine->read_optimizer_range(l.offset, l.numel, m, v);
          return static_cast<const float*>(tensor.data());
        };
        if (io.gathers())
          io.gather_full(moments, second ? "exp_avg_sq." : "exp_avg.", keep);
        else  // the same collectives, in the order the gathering replica's rank asks
          for (const ParamTensor* l : io.owned_local()) moments(*l);
      }
    } catch (const std::exception& e) {
      if (stream) stream->close(e.what());  // the write ends (and removes its temp directory)
      throw;
    }
    if (stream) writer.end_stream(*stream);
  };
  // A stop signal that reached any rank, asked by every rank at the same point
  // of an evaluation: the answer (the signal, or 0) is the same on all of them.
  int eval_stopped_by = 0;
  auto stop_agreed = [&] {
    double sig = StopSignals::received();
    comm->all_reduce(&sig, 1, dist::DType::F64, dist::ReduceOp::Max);
    eval_stopped_by = static_cast<int>(sig);
    return eval_stopped_by != 0;
  };
  auto run_eval = [&](int64_t done, bool record = true) {
    // Every replica evaluates its share of the micro-batches: the same numbers as one process.
    if (!has_val) return EvalResult{};
    EvalResult r =
        evaluate(*engine, *data, MB, T, tc.eval_sequences, pipe, groups.pp_comm, groups.dp_comm, stop_agreed);
    if (r.abandoned) {  // the checkpoint comes first; `kvshift eval --checkpoint` gives these numbers later
      progress.finish_line();
      if (rank0) spdlog::warn("eval @ step {}: abandoned after {}", done, StopSignals::name(eval_stopped_by));
      return r;
    }
    if (!rank0 || !record) return r;
    nlohmann::json j = {{"type", "eval"}, {"step", done}, {"val_loss", r.loss}, {"accuracy", r.accuracy},
                        {"scored_tokens", r.scored_tokens}};
    if (!r.sources.empty()) j["sources"] = eval_sources_json(r);
    metrics.write(j);
    progress.finish_line();
    spdlog::info("eval @ step {}: val_loss {:.4f}, {} {:.2f}%{}", done, r.loss,
                 data->accuracy_name() + " accuracy", 100 * r.accuracy, eval_sources_text(r));
    last_eval_acc = r.accuracy;
    last_eval_step = done;
    return r;
  };

  // Model FLOPs (model/flops.h) per token, and MFU's denominator: 0 on the CPU.
  const double flops_per_token = train_flops_per_token(cfg.model, T);
  const double peak_tflops = train_step.device_peak_tflops();
  const int64_t inf_gradient_step = inf_gradient_fault_step();
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;  // 0, or where a resume starts
  double smoothed_step_s = 0;  // the progress line shows an EMA: one step's rate is too noisy to read
  for (; step < tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    watch.begin(step + 1);
    const double lr = learning_rate(tc, step);
    ProfileRange step_range("step", step + 1);
    std::optional<ProfileRange> data_range(std::in_place, "data");
    batch.fill(*data, Split::Train, static_cast<uint64_t>(step) * GB + static_cast<uint64_t>(groups.dp_rank) * LB,
               LB);
    double scored = 0;
    for (float m : batch.mask) scored += m;
    dp_comm.all_reduce(&scored, 1, dist::DType::F64, dist::ReduceOp::Sum);  // exact: a sum of integers
    // The loss is the mean over every scored token of the global batch, so each
    // micro-batch's gradient is scaled by 1/(scored tokens of the whole batch).
    double grad_scale = scored > 0 ? 1.0 / scored : 0.0;
    if (step + 1 == inf_gradient_step && groups.dp_rank == groups.dp - 1) grad_scale = HUGE_VAL;
    data_range.reset();
    const TrainStep::Gradients g = train_step.compute_gradients(batch.micro(0, LB), grad_scale);
    // Both are global (all-reduced), so a non-finite value stops every rank at the same step.
    const double loss = scored > 0 ? g.loss_sum / scored : 0.0;
    const double gnorm = g.norm;
    if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
      progress.finish_line();
      const std::string last = latest_checkpoint(ckpt_root);
      fail("step {}: {} is {} — stopping; {}", step + 1, std::isfinite(loss) ? "gradient norm" : "loss",
           std::isfinite(loss) ? gnorm : loss,
           last.empty() ? "no checkpoint was saved yet" : fmt::format("the last checkpoint ({}) is intact", last));
    }
    AdamWHyper hp{lr, tc.beta1, tc.beta2, tc.eps, tc.weight_decay, step + 1, 1.0};
    if (tc.grad_clip > 0 && gnorm > tc.grad_clip) hp.grad_scale = tc.grad_clip / (gnorm + 1e-6);
    train_step.optimizer_step(hp);
    if (const std::string timing = train_step.take_gemm_timing(); rank0 && !timing.empty()) {
      progress.finish_line();
      spdlog::info("{}", timing);
    }

    const int64_t done = step + 1;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = static_cast<double>(GB) * T / dt;
    const double tflops = flops_per_token * tok_s / comm->size() / 1e12;  // per process, as bench counts them
    smoothed_step_s = smoothed_step_s == 0 ? dt : 0.9 * smoothed_step_s + 0.1 * dt;
    watch.end(dt);
    summary.losses.push_back(loss);
    auto write_train_line = [&] {
      nlohmann::json j = {{"type", "train"},       {"step", done},
                          {"loss", loss},          {"lr", lr},
                          {"grad_norm", gnorm},    {"scored_tokens", static_cast<int64_t>(scored)},
                          {"tokens_per_s", tok_s}, {"step_time_s", dt},
                          {"model_tflops_per_s", tflops}};
      if (peak_tflops > 0) j["mfu"] = tflops / peak_tflops;
      metrics.write(j);
    };
    const bool line_due = done % tc.log_every == 0 || done == tc.steps;
    if (rank0 && line_due) write_train_line();
    if (!opt.quiet && rank0) {
      const double smoothed_tok_s = static_cast<double>(GB) * T / smoothed_step_s;
      std::string extra =
          peak_tflops > 0
              ? fmt::format("MFU {:.1f}%", 100 * flops_per_token * smoothed_tok_s / comm->size() / 1e12 / peak_tflops)
              : "";
      if (std::isfinite(last_eval_acc))
        extra += fmt::format("{}acc {:.1f}% (step {})", extra.empty() ? "" : " | ", 100 * last_eval_acc,
                             last_eval_step);
      progress.update(done, loss, lr, smoothed_tok_s, extra);
    }
    const bool last = done == tc.steps;
    if ((tc.eval_every > 0 && done % tc.eval_every == 0) || last) summary.final_eval = run_eval(done);
    const bool checkpoint_due = (tc.checkpoint_every > 0 && done % tc.checkpoint_every == 0) || last;
    if (checkpoint_due) save(done);
    // Every rank learns here whether any rank was asked to stop, so all stop after the same step.
    // After the last step only an abandoned evaluation makes it a stop (the run is not complete).
    if (const int sig = watch.boundary(done); sig != 0 && (!last || summary.final_eval.abandoned)) {
      if (rank0 && !line_due) write_train_line();  // the last step trained has its line, as a run's end has
      if (!checkpoint_due) save(done);
      summary.stopped_by = StopSignals::name(sig);
      step = done;
      break;
    }
  }
  progress.finish_line();
  summary.steps_done = step;
  if (rank0) summary.last_checkpoint = writer.wait();
  // A resumed run that was already complete trains nothing: its evaluation is
  // the summary's, not a second line for the same step in metrics.jsonl.
  // Unless that evaluation was abandoned by a stop signal: then this one is the step's line.
  if (summary.losses.empty() && summary.final_eval.sequences == 0 && summary.stopped_by.empty()) {
    summary.final_eval = run_eval(step, /*record=*/metrics_steps(opt.run_dir + "/metrics.jsonl").last_eval < step);
    if (summary.final_eval.abandoned) summary.stopped_by = StopSignals::name(eval_stopped_by);
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (rank0) {
    if (first_step == 0)
      spdlog::info("done: {} steps in {}", step, format_duration(total_s));
    else
      spdlog::info("done: step {}, {} steps in {} since the resume at step {}", step, step - first_step,
                   format_duration(total_s), first_step);
  }
  return summary;
}

}  // namespace kvs
