// Experiment configuration: the JSON file a user writes, as C++ structs.
// The `model` object uses Hugging Face LlamaConfig key names plus `kv_shift`.
// Parsing is strict: unknown keys, wrong types and impossible shapes are
// errors naming the key (see config.cpp and docs/CONFIG.md). Enum-valued keys
// are the enums of config_enums.h, parsed once.
#pragma once
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config_enums.h"

namespace kvs {

struct KvShiftConfig {
  bool enabled = true;
  int window = 1;          // number of past positions mixed in (paper: 1)
  bool shift_k = true;     // shift the keys / the values (false: the K-only and V-only variants)
  bool shift_v = true;
  bool shift_q = false;    // QKV shifting (appendix J): q shifted too, per query head
  // How the stored shift tensors map to coefficients (section 4.6):
  //   Free         the stored [H, W+1] values are the coefficients (default)
  //   SigmoidGate  window 1 only: column 1 holds a gate logit g, column 0 is
  //                unused (kept 0); cur = sigmoid(g), prev = 1 - sigmoid(g)
  //   Clamp01      free coefficients, projected onto [0, 1] after every
  //                optimizer step
  ShiftParametrization parametrization = ShiftParametrization::Free;

  bool sigmoid_gate() const { return enabled && parametrization == ShiftParametrization::SigmoidGate; }
  bool operator==(const KvShiftConfig&) const = default;
};

// Llama 3's RoPE scaling (Hugging Face's rope_scaling / rope_parameters with
// rope_type "llama3"): low frequencies slowed by `factor`, high ones kept, a
// smooth blend between; it changes the inverse frequencies only
// (kernels/cpu/rope.h rope_inv_freq). rope_type "default": plain RoPE, the
// other fields unused.
struct RopeScalingConfig {
  RopeType rope_type = RopeType::Default;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;

  bool operator==(const RopeScalingConfig&) const = default;
};

struct ModelConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 100000.0;
  RopeScalingConfig rope_scaling;  // written only when rope_type is not "default"
  PositionEncoding position_encoding = PositionEncoding::Rope;  // None: NoPE, the Theorem 2 setting (toy ablations)
  int vocab_size = 0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // std of the normal init of matrices
  KvShiftConfig kv_shift;
  // Packed documents (docs/DATA.md "Document boundaries"): a document starts
  // at each bos_token_id in the inputs (and at position 0).
  //   None               every position sees the whole sequence (default)
  //   Shift              the KV shift restarts at each document: the rows
  //                      before it count as the zeros before position 0, so
  //                      K_{t-1}/V_{t-1} never leak across documents
  //   ShiftAndAttention  also causal attention within the document only
  DocumentBoundaries document_boundaries = DocumentBoundaries::None;
  int bos_token_id = -1;  // -1: none (needed unless document_boundaries is None)

  int head_dim() const { return hidden_size / num_attention_heads; }
  int q_dim() const { return num_attention_heads * head_dim(); }
  int kv_dim() const { return num_key_value_heads * head_dim(); }

  bool operator==(const ModelConfig&) const = default;
};

struct InductionDataConfig {
  int token_lo = 11;        // token ids drawn from [token_lo, token_hi)
  int token_hi = 8000;
  int pool_size = 512;      // distinct tokens a sequence draws from (paper: = length)
  int max_repeats = 0;      // stop a sequence after this many induction events (0 = fill it)
  int pad_token = 0;

  bool operator==(const InductionDataConfig&) const = default;
};

struct ShardDataConfig {
  std::vector<std::string> train;  // shard files (globs allowed), relative to the config file
  std::vector<std::string> val;    // if empty, the last val_fraction of the train tokens
  double val_fraction = 0.05;
  // Empty: the train entries form one stream. Else one weight per train entry:
  // each entry is a source, sampled in proportion to its weight (data/blend.h).
  std::vector<double> weights;

  bool operator==(const ShardDataConfig&) const = default;
};

// The paper's 3-gram memorisation task (section 3.3; src/data/ngram.h).
struct NgramDataConfig {
  int token_lo = 11;        // tokens x1, x2, x3 drawn from [token_lo, token_hi)
  int token_hi = 8000;
  int num_pairs = 200;      // distinct (x1, x2) pairs of the table, each with its x3
  uint64_t table_seed = 0;  // seeds the table (shared by train and validation)

  bool operator==(const NgramDataConfig&) const = default;
};

// Multi-hop induction (appendix H, Sanford et al. 2024's hop_k; src/data/hopk.h).
struct HopkDataConfig {
  int token_lo = 11;        // the alphabet is [token_lo, token_hi): keep it small so tokens repeat
  int token_hi = 15;
  int k = 2;                // hops followed from the last position

  bool operator==(const HopkDataConfig&) const = default;
};

struct DataConfig {
  DatasetType type = DatasetType::Induction;  // which of the sections below is used
  InductionDataConfig induction;
  NgramDataConfig ngram;
  HopkDataConfig hopk;
  ShardDataConfig shards;
  // The tokenizer directory the data was prepared with (relative to the config
  // file; "" = none: the toy tasks and the byte corpus). Its vocab_size must not
  // exceed model.vocab_size; generate/export-hf read it.
  std::string tokenizer;

  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  uint64_t seed = 1234;
  int steps = 1000;
  int micro_batch_size = 8;       // sequences per forward/backward
  int grad_accum_steps = 1;       // micro-batches per optimizer step
  int seq_len = 128;
  double lr = 2e-4;
  double min_lr = 0.0;            // where the cosine, linear and wsd schedules end
  int warmup_steps = 1000;
  LrSchedule schedule = LrSchedule::Constant;  // Constant: the paper's
  int decay_steps = 0;            // "wsd": its final decay's length (the stable phase is the rest)
  LrDecayShape decay_shape = LrDecayShape::Linear;  // "wsd": the final decay's shape
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;         // global-norm clip; 0 disables
  int eval_every = 100;           // steps; 0 = only at the end
  int eval_sequences = 256;       // validation sequences per evaluation
  int checkpoint_every = 0;       // steps; 0 = only at the end
  int log_every = 1;              // metrics.jsonl lines every N steps
  int threads = 0;                // OpenMP threads; 0 = all cores
  Recompute recompute = Recompute::None;                   // CUDA activation recomputation
  AttentionImpl attention_backend = AttentionImpl::Flash;  // CUDA attention: Flash (ours) or Cudnn (cuDNN fused SDPA)
  bool overlap_optimizer = true;  // CUDA: AdamW overlaps the next forward (Engine::set_overlap_optimizer)
  bool shard_master = true;  // ZeRO-1 shards the fp32 master weights too (CUDA; Engine::keep_master_range)
  // CUDA: time cuBLASLt's candidate algorithms for each GEMM shape after the
  // first step and keep the fastest (Engine::set_time_gemm_algorithms); runs
  // are then not bit-reproducible. Off: cuBLASLt's first, in every run.
  bool time_gemm_algorithms = false;
  int keep_checkpoints = 0;        // newest step directories kept; 0 = all
  bool async_checkpoint = false;  // write checkpoints from a background thread
  // Host memory (GB) world rank 0 may hold for checkpoint tensors not yet
  // written; 0: the whole checkpoint with async_checkpoint, else 1 GB.
  double checkpoint_buffer_gb = 0;
  StopSignal stop_signal = StopSignal::Usr1;  // stops the run after a checkpoint, like SIGTERM
  double straggler_factor = 3.0;  // a step slower than this x the median is reported; 0 = off

  // What rank 0 holds, at most, of a checkpoint of `checkpoint_bytes` not yet
  // written (checkpoint_buffer_gb's rule; the trainer and `kvshift info`).
  uint64_t checkpoint_buffer_bytes(uint64_t checkpoint_bytes) const {
    const uint64_t set = checkpoint_buffer_gb > 0 ? static_cast<uint64_t>(checkpoint_buffer_gb * 1e9)
                         : async_checkpoint      ? checkpoint_bytes
                                                 : uint64_t{1000000000};
    return std::min(set, checkpoint_bytes);
  }

  bool operator==(const TrainConfig&) const = default;
};

// Processes = dp x cp x tp (docs/PARALLEL.md); dp is what is left over.
struct ParallelConfig {
  int tp = 1;  // tensor-parallel size
  // Sequence parallelism within the TP group: the residual stream and norms hold
  // seq rows / tp per rank (needs tp > 1).
  bool sequence_parallel = false;
  int cp = 1;  // context-parallel size: each sequence split over cp ranks
  // Pipeline parallelism: pp stages of consecutive decoder layers, each rank
  // holding virtual_stages chunks of them (Megatron's interleaved 1F1B when > 1);
  // layers_per_stage (pp x virtual_stages entries, in pipeline order) or an even split.
  int pp = 1;
  int virtual_stages = 1;
  std::vector<int> layers_per_stage;

  bool operator==(const ParallelConfig&) const = default;
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  Device device = Device::Cpu;  // Cpu: the fp32 reference; Cuda: bf16 with fp32 master weights
  std::string name;             // free-form run name
  std::string source_path;      // file it was read from ("" if built in code)

  int global_batch_sequences() const { return train.micro_batch_size * train.grad_accum_steps; }
  // Field-wise equality, source_path included (compare a copy with it cleared to ignore it).
  bool operator==(const Config&) const = default;
};

// One phrase for logs: "off" or e.g. "on (K+V, window 1, free)".
std::string describe_kv_shift(const KvShiftConfig& k);

// Reads a config file, applies `key.path=value` overrides (value parsed as JSON,
// falling back to a string), validates, and returns it. Throws kvs::Error with
// a one-line message naming the file and key on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// load_config without validate(): for a caller that replaces a section first
// (eval takes the checkpoint's model) and then validates the whole.
Config read_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config config_from_json(const nlohmann::json& j, const std::string& origin);
void apply_override(nlohmann::json& j, const std::string& assignment, const std::string& origin);
void validate(const Config& c, const std::string& origin);
nlohmann::json to_json(const Config& c);

// The model section alone as a Hugging Face style config.json (LlamaConfig keys + kv_shift).
nlohmann::json model_to_hf_json(const ModelConfig& m);
ModelConfig model_from_hf_json(const nlohmann::json& j, const std::string& origin);

}  // namespace kvs
