// Experiment configuration: the field table of every section, and what is
// built on them: strict JSON parsing, overrides, validation and
// serialisation. See docs/CONFIG.md for every key, config_fields.h for how a
// table is read and written and for the conventions of the messages.
//
// Adding a key: the member in its struct (config.h), one line in its
// section's table below, a row in docs/CONFIG.md. A rule that relates keys to
// each other goes in validate_model() or validate().
#include "model/config.h"

#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "data/blend_schedule.h"
#include "model/config_fields.h"

namespace kvs {

using nlohmann::json;
using namespace config;

namespace {

// ---------------------------------------------------------------------------
// The field tables: every key of the config file, once, in the order of
// docs/CONFIG.md (which is also the order of parsing and of suggestions).
// ---------------------------------------------------------------------------

const Fields<KvShiftConfig>& kv_shift_fields() {
  using K = KvShiftConfig;
  static const Fields<K> fields = {
      {"enabled", &K::enabled},
      {"window", &K::window, closed(1, 8)},  // what kernels and checkpoints handle; training: 1 to 3 (validate)
      {"shift_k", &K::shift_k},
      {"shift_v", &K::shift_v},
      {"shift_q", &K::shift_q},                  // absent in older checkpoints: false
      {"parametrization", &K::parametrization},  // absent in older checkpoints: free
  };
  return fields;
}

// Hugging Face's names (LlamaConfig.rope_scaling of transformers 4.x).
const Fields<RopeScalingConfig>& rope_scaling_fields() {
  using R = RopeScalingConfig;
  static const Fields<R> fields = {
      {"rope_type", &R::rope_type},
      {"factor", &R::factor, at_least(1, "a context stretched, not shrunk")},
      {"low_freq_factor", &R::low_freq_factor, above(0)},
      {"high_freq_factor", &R::high_freq_factor, above(0)},
      {"original_max_position_embeddings", &R::original_max_position_embeddings, positive()},
  };
  return fields;
}

// Hugging Face LlamaConfig names plus kv_shift: the run config's `model`
// section and a checkpoint's config.json (model_from_hf_json) alike.
const Fields<ModelConfig>& model_fields() {
  using M = ModelConfig;
  static const Fields<M> fields = {
      {"hidden_size", &M::hidden_size, kRequired, positive()},
      {"intermediate_size", &M::intermediate_size, kRequired, positive()},
      {"num_hidden_layers", &M::num_hidden_layers, kRequired, closed(1, 4096)},
      {"num_attention_heads", &M::num_attention_heads, kRequired, positive()},
      {"num_key_value_heads", &M::num_key_value_heads, positive(), default_from(&M::num_attention_heads)},
      {"rms_norm_eps", &M::rms_norm_eps, at_least(1e-30, "a float32 number, not 0 once rounded")},
      {"rope_theta", &M::rope_theta, at_least(1, "below 1 the frequencies grow along the head instead of falling")},
      {"rope_scaling", &M::rope_scaling, rope_scaling_fields(), kOmitIfDefault},
      {"position_encoding", &M::position_encoding},  // absent in older checkpoints: rope
      {"vocab_size", &M::vocab_size, kRequired, positive()},
      {"max_position_embeddings", &M::max_position_embeddings, kRequired, positive()},
      {"tie_word_embeddings", &M::tie_word_embeddings},
      {"initializer_range", &M::initializer_range, above(0)},
      {"kv_shift", &M::kv_shift, kv_shift_fields()},
      // Written only when set, so the configs and checkpoints that do not use them stay as they are.
      {"document_boundaries", &M::document_boundaries, kOmitIfDefault},
      {"bos_token_id", &M::bos_token_id, kOmitIfDefault},
  };
  return fields;
}

const Fields<TrainConfig>& train_fields() {
  using T = TrainConfig;
  static const Fields<T> fields = {
      {"seed", &T::seed},
      {"steps", &T::steps, at_least(1)},
      {"micro_batch_size", &T::micro_batch_size, at_least(1)},
      {"grad_accum_steps", &T::grad_accum_steps, closed(1, 1 << 20)},
      {"seq_len", &T::seq_len, at_least(1)},
      {"lr", &T::lr, above(0)},
      {"min_lr", &T::min_lr},
      {"warmup_steps", &T::warmup_steps, at_least(0)},
      {"schedule", &T::schedule},
      {"decay_steps", &T::decay_steps, at_least(0), kOmitIfDefault},
      {"decay_shape", &T::decay_shape, kOmitIfDefault},
      {"beta1", &T::beta1, half_open(0, 1)},
      {"beta2", &T::beta2, half_open(0, 1)},
      {"eps", &T::eps, at_least(1e-30, "a float32 number, not 0 once rounded")},
      {"weight_decay", &T::weight_decay, at_least(0)},
      {"grad_clip", &T::grad_clip, at_least(0, "0 disables clipping")},
      {"eval_every", &T::eval_every, at_least(0)},
      {"eval_sequences", &T::eval_sequences, closed(1, 1 << 24)},
      {"checkpoint_every", &T::checkpoint_every, at_least(0)},
      {"log_every", &T::log_every, at_least(1)},
      {"threads", &T::threads, closed(0, 4096)},
      {"recompute", &T::recompute},
      {"attention_backend", &T::attention_backend},
      {"overlap_optimizer", &T::overlap_optimizer, kOmitIfDefault},
      {"shard_master", &T::shard_master, kOmitIfDefault},
      {"time_gemm_algorithms", &T::time_gemm_algorithms, kOmitIfDefault},
      {"keep_checkpoints", &T::keep_checkpoints, at_least(0, "0 keeps every checkpoint"), kOmitIfDefault},
      {"async_checkpoint", &T::async_checkpoint, kOmitIfDefault},
      {"checkpoint_buffer_gb", &T::checkpoint_buffer_gb,
       at_least(0, "0: the whole checkpoint with async_checkpoint, else 1 GB"), kOmitIfDefault},
      {"stop_signal", &T::stop_signal, kOmitIfDefault},
      {"straggler_factor", &T::straggler_factor, at_least(0, "0 turns the straggler report off"), kOmitIfDefault},
  };
  return fields;
}

const Fields<InductionDataConfig>& induction_fields() {
  using I = InductionDataConfig;
  static const Fields<I> fields = {
      {"token_lo", &I::token_lo, at_least(0)},
      {"token_hi", &I::token_hi},
      {"pool_size", &I::pool_size},
      {"max_repeats", &I::max_repeats, at_least(0)},
      {"pad_token", &I::pad_token},
  };
  return fields;
}

const Fields<NgramDataConfig>& ngram_fields() {
  using N = NgramDataConfig;
  static const Fields<N> fields = {
      {"token_lo", &N::token_lo, at_least(0)},
      {"token_hi", &N::token_hi},
      {"num_pairs", &N::num_pairs},
      {"table_seed", &N::table_seed},
  };
  return fields;
}

const Fields<HopkDataConfig>& hopk_fields() {
  using H = HopkDataConfig;
  static const Fields<H> fields = {
      {"token_lo", &H::token_lo, at_least(0)},
      {"token_hi", &H::token_hi},
      {"k", &H::k},
  };
  return fields;
}

const Fields<ShardDataConfig>& shards_fields() {
  using S = ShardDataConfig;
  static const Fields<S> fields = {
      {"train", &S::train},
      {"val", &S::val},
      {"val_fraction", &S::val_fraction, half_open(0, 1)},
      {"weights", &S::weights, kOmitIfDefault},
  };
  return fields;
}

const Fields<DataConfig>& data_fields() {
  using D = DataConfig;
  static const Fields<D> fields = {
      {"type", &D::type},
      {"induction", &D::induction, induction_fields()},
      {"ngram", &D::ngram, ngram_fields()},
      {"hopk", &D::hopk, hopk_fields()},
      {"shards", &D::shards, shards_fields()},
      // Absent = none, so configs without a tokenizer (toy tasks, byte corpus) round-trip unchanged.
      {"tokenizer", &D::tokenizer, kOmitIfDefault},
  };
  return fields;
}

const Fields<ParallelConfig>& parallel_fields() {
  using P = ParallelConfig;
  static const Fields<P> fields = {
      {"tp", &P::tp, closed(1, 65536)},
      {"sequence_parallel", &P::sequence_parallel, kOmitIfDefault},
      {"cp", &P::cp, closed(1, 65536), kOmitIfDefault},
      {"pp", &P::pp, closed(1, 4096), kOmitIfDefault},
      {"virtual_stages", &P::virtual_stages, closed(1, 4096), kOmitIfDefault},
      {"layers_per_stage", &P::layers_per_stage, kOmitIfDefault},
  };
  return fields;
}

const Fields<Config>& config_fields() {
  using C = Config;
  static const Fields<C> fields = {
      {"name", &C::name},
      {"device", &C::device},
      {"model", &C::model, model_fields(), kRequired},
      {"train", &C::train, train_fields()},
      {"data", &C::data, data_fields()},
      {"parallel", &C::parallel, parallel_fields()},
  };
  return fields;
}

// Keys of a Hugging Face config.json that we accept beside the model keys.
const std::vector<std::string>& hf_extra_keys() {
  static const std::vector<std::string> k = {"architectures", "model_type", "head_dim",    "hidden_act",
                                             "attention_bias", "mlp_bias",  "torch_dtype", "eos_token_id"};
  return k;
}

const Schema& schema() {
  static const Schema s = [] {
    Schema built;
    add_to_schema(config_fields(), "", built);
    return built;
  }();
  return s;
}

Where where(const std::string& origin, const std::string& path) { return {origin, schema(), path}; }

// Reads key `k` of object `j` into `out` when it is there; false when it is not.
template <class T>
bool read_key(const json& j, const char* k, const Where& w, T& out) {
  const auto it = j.find(k);
  if (it == j.end()) return false;
  read_value(*it, w.at(k), out);
  return true;
}

// ---------------------------------------------------------------------------
// Validation beyond the tables' ranges: the rules that relate keys.
// ---------------------------------------------------------------------------

// `w` is the model object: "model" in a run config, "" in a config.json.
void validate_model(const ModelConfig& m, const Where& w) {
  check_section(model_fields(), m, w);
  check_section(kv_shift_fields(), m.kv_shift, w.at("kv_shift"));
  if (m.hidden_size % m.num_attention_heads != 0)
    fail("{}: {}: {} is not divisible by {} ({})", w.origin, w.key("hidden_size"), m.hidden_size,
         w.key("num_attention_heads"), m.num_attention_heads);
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    fail("{}: {}: {} ({}) is not divisible by {}", w.origin, w.key("num_key_value_heads"),
         w.key("num_attention_heads"), m.num_attention_heads, m.num_key_value_heads);
  if (m.head_dim() % 2 != 0)
    fail("{}: {}: head_dim = hidden_size / num_attention_heads = {} must be even (RoPE rotates pairs)", w.origin,
         w.key("hidden_size"), m.head_dim());
  if (m.bos_token_id < -1 || m.bos_token_id >= m.vocab_size)
    fail("{}: {}: must be -1 (none) or a token id in [0, vocab_size={}), got {}", w.origin, w.key("bos_token_id"),
         m.vocab_size, m.bos_token_id);
  if (m.document_boundaries != DocumentBoundaries::None && m.bos_token_id < 0)
    fail("{}: {}: \"{}\" needs {} (the token that starts a document)", w.origin, w.key("document_boundaries"),
         m.document_boundaries, w.key("bos_token_id"));
  if (m.rope_scaling.rope_type != RopeType::Default) {
    const Where r = w.at("rope_scaling");
    check_section(rope_scaling_fields(), m.rope_scaling, r);
    if (m.position_encoding != PositionEncoding::Rope)
      fail("{}: {}: \"{}\" scales RoPE, but {} is \"{}\"", w.origin, r.key("rope_type"), m.rope_scaling.rope_type,
           w.key("position_encoding"), m.position_encoding);
    if (!(m.rope_scaling.high_freq_factor > m.rope_scaling.low_freq_factor))
      fail("{}: {}: must be > {} ({}), got {}", w.origin, r.key("high_freq_factor"), r.key("low_freq_factor"),
           m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor);
  }
  if (m.kv_shift.parametrization == ShiftParametrization::SigmoidGate && m.kv_shift.window != 1)
    fail("{}: {}: \"sigmoid_gate\" needs kv_shift.window 1 (one gate per head), got window {}", w.origin,
         w.key("kv_shift.parametrization"), m.kv_shift.window);
}

// Only the section that data.type selects is checked: the others may hold anything.
void validate_data(const DataConfig& d, const ModelConfig& m, const TrainConfig& t, const Where& w) {
  const std::string& origin = w.origin;
  switch (d.type) {
    case DatasetType::Induction: {
      const auto& in = d.induction;
      check_section(induction_fields(), in, w.at("induction"));
      if (in.token_hi <= in.token_lo)
        fail("{}: data.induction.token_hi: must be > data.induction.token_lo ({}), got {}", origin, in.token_lo,
             in.token_hi);
      if (in.token_hi > m.vocab_size)
        fail("{}: data.induction.token_hi: {} exceeds model.vocab_size ({})", origin, in.token_hi, m.vocab_size);
      const int range = in.token_hi - in.token_lo;
      if (in.pool_size < 2 || in.pool_size > range)
        fail("{}: data.induction.pool_size: must be in [2, token_hi - token_lo = {}], got {}", origin, range,
             in.pool_size);
      if (in.pad_token < 0 || in.pad_token >= m.vocab_size)
        fail("{}: data.induction.pad_token: must be in [0, model.vocab_size = {}), got {}", origin, m.vocab_size,
             in.pad_token);
      if (in.pad_token >= in.token_lo && in.pad_token < in.token_hi)
        fail("{}: data.induction.pad_token: {} lies inside the sequence tokens [token_lo, token_hi) = [{}, {})",
             origin, in.pad_token, in.token_lo, in.token_hi);
      if (t.seq_len < 3)
        fail("{}: train.seq_len: the induction task needs >= 3 positions (A B ... A -> B), got {}", origin,
             t.seq_len);
      return;
    }
    case DatasetType::Ngram: {
      const auto& n = d.ngram;
      check_section(ngram_fields(), n, w.at("ngram"));
      if (n.token_hi <= n.token_lo)
        fail("{}: data.ngram.token_hi: must be > data.ngram.token_lo ({}), got {}", origin, n.token_lo, n.token_hi);
      if (n.token_hi > m.vocab_size)
        fail("{}: data.ngram.token_hi: {} exceeds model.vocab_size ({})", origin, n.token_hi, m.vocab_size);
      const int64_t range = n.token_hi - n.token_lo;
      if (n.num_pairs < 1 || n.num_pairs > range * range)
        fail("{}: data.ngram.num_pairs: must be in [1, (token_hi - token_lo)^2 = {}], got {}", origin, range * range,
             n.num_pairs);
      if (t.seq_len < 2)
        fail("{}: train.seq_len: the ngram task needs >= 2 positions (x1 x2 -> x3), got {}", origin, t.seq_len);
      return;
    }
    case DatasetType::Hopk: {
      const auto& h = d.hopk;
      check_section(hopk_fields(), h, w.at("hopk"));
      if (h.token_hi - h.token_lo < 2)
        fail("{}: data.hopk.token_hi: the alphabet [token_lo, token_hi) needs >= 2 tokens, got [{}, {})", origin,
             h.token_lo, h.token_hi);
      if (h.token_hi > m.vocab_size)
        fail("{}: data.hopk.token_hi: {} exceeds model.vocab_size ({})", origin, h.token_hi, m.vocab_size);
      if (h.k < 1 || h.k > t.seq_len - 2)
        fail("{}: data.hopk.k: must be in [1, train.seq_len - 2 = {}], got {}", origin, t.seq_len - 2, h.k);
      return;
    }
    case DatasetType::Shards: {
      const auto& s = d.shards;
      if (s.train.empty()) fail("{}: data.shards.train: must list at least one shard file or glob", origin);
      for (size_t i = 0; i < s.train.size(); ++i)
        if (s.train[i].empty()) fail("{}: data.shards.train[{}]: empty path", origin, i);
      for (size_t i = 0; i < s.val.size(); ++i)
        if (s.val[i].empty()) fail("{}: data.shards.val[{}]: empty path", origin, i);
      check_section(shards_fields(), s, w.at("shards"));
      if (!s.weights.empty()) {
        if (s.weights.size() != s.train.size())
          fail("{}: data.shards.weights: {} weight{} for {} data.shards.train entr{} (one weight per entry: each "
               "entry is a source)",
               origin, s.weights.size(), s.weights.size() == 1 ? "" : "s", s.train.size(),
               s.train.size() == 1 ? "y" : "ies");
        if (!s.val.empty() && s.val.size() != s.train.size())
          fail("{}: data.shards.val: {} entr{} for {} sources (with data.shards.weights, one validation file or glob "
               "per source, or none: each source's last val_fraction)",
               origin, s.val.size(), s.val.size() == 1 ? "y" : "ies", s.train.size());
        blend_counts(s.weights, origin + ": data.shards.weights");
      }
      return;
    }
  }
}

// JSON text -> json, with duplicate keys rejected (nlohmann would silently keep the last).
json parse_text(const std::string& text, const std::string& origin) {
  struct Frame {
    bool object;
    std::string path;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  std::string last_key;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        std::string path;
        if (!stack.empty()) path = stack.back().object ? join(stack.back().path, last_key) : stack.back().path + "[]";
        stack.push_back({ev == json::parse_event_t::object_start, path, {}});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!stack.empty() && !stack.back().keys.insert(last_key).second)
          fail("{}: duplicate key '{}'", origin, join(stack.back().path, last_key));
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::parse_error& e) {
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line L, column C: <what>".
    // We keep <what> but count line and column ourselves from the byte offset so
    // an error on a newline points at the end of its line, not at "column 0" of the next.
    std::string what = e.what();
    static const std::regex re(R"(line \d+, column \d+: (.*))");
    std::smatch m;
    if (std::regex_search(what, m, re)) what = m[1].str();
    const size_t pos = std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size());  // 0-based offset of the bad char
    const size_t line = 1 + std::count(text.begin(), text.begin() + pos, '\n');
    const size_t nl = pos == 0 ? std::string::npos : text.rfind('\n', pos - 1);
    const size_t col = nl == std::string::npos ? pos + 1 : pos - nl;
    fail("{}: invalid JSON at line {}, column {}: {}", origin, line, col, what);
  } catch (const json::exception& e) {  // a number out of range ("1e400"): no position given
    fail("{}: invalid JSON: {}", origin, one_line_error_text(e));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.
// ---------------------------------------------------------------------------

Config config_from_json(const json& j, const std::string& origin) {
  Config c;
  read_section(config_fields(), j, where(origin, ""), c);
  return c;
}

void apply_override(json& j, const std::string& assignment, const std::string& origin) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos)
    fail("{}: override '{}': expected KEY.PATH=VALUE (no '=' found)", origin, assignment);
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  if (path.empty()) fail("{}: override '{}': empty key path before '='", origin, assignment);

  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts)
    if (p.empty()) fail("{}: override '{}': empty component in key path '{}'", origin, assignment, path);
  if (!j.is_object()) fail("{}: override '{}': the config is not a JSON object", origin, assignment);

  json* cur = &j;
  std::string sofar;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string parent = sofar;
    sofar = join(sofar, parts[i]);
    if (!cur->contains(parts[i])) {
      if (schema().find(sofar) == nullptr) {
        const Schema::Section* ps = schema().find(parent);
        fail("{}: override '{}': unknown key '{}'{}", origin, assignment, sofar,
             ps ? schema().suggestion(parts[i], parent, ps->keys) : std::string());
      }
      (*cur)[parts[i]] = json::object();  // a known section the file leaves out
    }
    cur = &(*cur)[parts[i]];
    if (!cur->is_object())
      fail("{}: override '{}': '{}' is {}, not an object", origin, assignment, sofar, describe(*cur));
  }
  // The last key: when its parent is a known section, check it here so the
  // message names the override rather than the file.
  if (const Schema::Section* ps = schema().find(sofar)) {
    const auto& k = parts.back();
    if (std::find(ps->keys.begin(), ps->keys.end(), k) == ps->keys.end())
      fail("{}: override '{}': unknown key '{}'{}", origin, assignment, path, schema().suggestion(k, sofar, ps->keys));
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    // Numbers as a shell user writes them but JSON does not (.001, 1., +1, 1e-3 with a
    // leading +) are numbers; anything else not JSON is a string (e.g. device=cuda).
    char* end = nullptr;
    const double x = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
    const bool number = !text.empty() && end && *end == '\0' && std::isfinite(x) &&
                        text.find_first_of("xXnN") == std::string::npos;  // not hex floats, inf or nan
    const bool integral = text.find_first_of(".eE") == std::string::npos && std::fabs(x) < 9e18;
    if (!number)
      value = text;
    else if (integral)
      value = static_cast<int64_t>(std::strtoll(text.c_str(), nullptr, 10));
    else
      value = x;
  }
  (*cur)[parts.back()] = std::move(value);
}

void validate(const Config& c, const std::string& origin) {
  const Where top = where(origin, "");
  const ModelConfig& m = c.model;
  validate_model(m, top.at("model"));
  // Kernels and checkpoints handle windows up to 8 (the kv_shift table); training
  // is limited to the windows the paper ran (1, and 2 and 3 in section 4.7).
  if (m.kv_shift.window > 3)
    fail("{}: model.kv_shift.window: training supports windows 1 to 3 (the paper's), got {}", origin,
         m.kv_shift.window);
  if (c.device == Device::Cuda && m.document_boundaries == DocumentBoundaries::ShiftAndAttention &&
      c.train.attention_backend == AttentionImpl::Cudnn)
    fail("{}: model.document_boundaries: \"{}\" masks attention with our flash kernels; train.attention_backend "
         "\"cudnn\" has no document masks here",
         origin, m.document_boundaries);
  if (c.device == Device::Cuda) {
    const int d = m.head_dim();
    if (d != 16 && d != 32 && d != 64 && d != 128)
      fail("{}: device: \"cuda\" needs head_dim (hidden_size / num_attention_heads) of 16, 32, 64 or 128, got {}",
           origin, d);
  }

  const TrainConfig& t = c.train;
  check_section(train_fields(), t, top.at("train"));
  if (t.seq_len > m.max_position_embeddings)
    fail("{}: train.seq_len: {} exceeds model.max_position_embeddings ({})", origin, t.seq_len,
         m.max_position_embeddings);
  if (!(t.min_lr >= 0 && t.min_lr <= t.lr))
    fail("{}: train.min_lr: must be in [0, train.lr = {}], got {}", origin, t.lr, t.min_lr);
  // The wsd schedule's keys mean nothing to the others: set there, they would be silently ignored.
  if (t.schedule == LrSchedule::Wsd) {
    const int most = std::max(0, t.steps - t.warmup_steps);
    if (t.decay_steps < 1 || t.decay_steps > most)
      fail("{}: train.decay_steps: the \"wsd\" schedule needs the length of its final decay, 1 ... train.steps - "
           "train.warmup_steps = {}, got {}",
           origin, most, t.decay_steps);
  } else {
    if (t.decay_steps != 0)
      fail("{}: train.decay_steps: only the \"wsd\" schedule has a final decay phase; train.schedule is \"{}\"",
           origin, t.schedule);
    if (t.decay_shape != LrDecayShape::Linear)
      fail("{}: train.decay_shape: only the \"wsd\" schedule's final decay has a shape to choose; train.schedule "
           "is \"{}\"",
           origin, t.schedule);
  }
  if (t.attention_backend != AttentionImpl::Flash && c.device != Device::Cuda)
    fail("{}: train.attention_backend: \"{}\" needs device \"cuda\" (device is \"{}\")", origin, t.attention_backend,
         c.device);

  validate_data(c.data, m, t, top.at("data"));

  check_section(parallel_fields(), c.parallel, top.at("parallel"));
  check_tensor_parallel(c.model, c.parallel.tp, origin);
  const ParallelConfig& p = c.parallel;
  if (p.sequence_parallel && p.tp == 1)
    fail("{}: parallel.sequence_parallel: needs tensor parallelism (parallel.tp > 1), got tp 1 (without it: "
         "--set parallel.sequence_parallel=false)",
         origin);
  if (p.sequence_parallel && t.seq_len % p.tp != 0)
    fail("{}: parallel.sequence_parallel: train.seq_len ({}) must be divisible by parallel.tp ({}): each rank holds "
         "an equal share of the rows",
         origin, t.seq_len, p.tp);
  // With context parallelism a rank's rows are micro-batch x seq_len / cp, and
  // the last micro-batch of an evaluation may hold one sequence.
  if (p.sequence_parallel && p.cp > 1 && t.seq_len % p.cp == 0 && (t.seq_len / p.cp) % p.tp != 0)
    fail("{}: parallel.sequence_parallel: train.seq_len / parallel.cp ({} / {} = {}) must be divisible by "
         "parallel.tp ({}): each rank of a context-parallel group holds that many positions of a sequence, and the "
         "tensor-parallel ranks an equal share of them",
         origin, t.seq_len, p.cp, t.seq_len / p.cp, p.tp);
  if (p.cp > 1 && t.seq_len % (2 * p.cp) != 0)
    fail("{}: parallel.cp ({}): train.seq_len ({}) must be divisible by 2 x cp = {}: each rank holds two equal "
         "chunks of every sequence",
         origin, p.cp, t.seq_len, 2 * p.cp);
  if (p.cp > 1 && m.kv_shift.enabled && t.seq_len / (2 * p.cp) < m.kv_shift.window)
    fail("{}: parallel.cp ({}): chunks of train.seq_len / (2 x cp) = {} positions are shorter than "
         "model.kv_shift.window ({}): the shift's halo comes from the previous chunk alone",
         origin, p.cp, t.seq_len / (2 * p.cp), m.kv_shift.window);
  if (p.virtual_stages > 1 && p.pp == 1)
    fail("{}: parallel.virtual_stages ({}): interleaving needs pipeline parallelism (parallel.pp > 1) (without it: "
         "--set parallel.virtual_stages=1)",
         origin, p.virtual_stages);
  if (!p.layers_per_stage.empty() && p.pp == 1)
    fail("{}: parallel.layers_per_stage: needs pipeline parallelism (parallel.pp > 1) (without it: --set "
         "parallel.layers_per_stage=[])",
         origin);
  if (p.pp > 1) StageSplit::make(m, p.pp, p.virtual_stages, p.layers_per_stage, origin);  // a shape that does not split
  if (c.device == Device::Cuda && p.cp > 1 && t.attention_backend == AttentionImpl::Cudnn)
    fail("{}: parallel.cp: device \"cuda\" runs ring attention on the flash kernels: needs train.attention_backend "
         "\"flash\" or \"flash-mma\"",
         origin);
}

json to_json(const Config& c) { return write_section(config_fields(), c); }

json model_to_hf_json(const ModelConfig& m) {
  json j = write_section(model_fields(), m);
  j["architectures"] = json::array({m.kv_shift.enabled ? "KvShiftLlamaForCausalLM" : "LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["head_dim"] = m.num_attention_heads > 0 ? m.head_dim() : 0;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["torch_dtype"] = "float32";
  return j;
}

ModelConfig model_from_hf_json(const json& j, const std::string& origin) {
  const Where w = where(origin, "");
  ModelConfig m;
  read_section(model_fields(), j, w, m, hf_extra_keys());
  if (!j.contains("kv_shift")) m.kv_shift.enabled = false;  // a plain Llama config.json
  validate_model(m, w);

  // The HF-only keys: tolerated, and checked where a value would mean a model we do not implement.
  std::vector<std::string> archs;
  read_key(j, "architectures", w, archs);
  std::string s;
  if (read_key(j, "model_type", w, s) && s != "llama")
    fail("{}: model_type: expected \"llama\", got \"{}\"", origin, s);
  if (read_key(j, "hidden_act", w, s) && s != "silu")
    fail("{}: hidden_act: only \"silu\" is implemented, got \"{}\"", origin, s);
  read_key(j, "torch_dtype", w, s);
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool b = false;
    if (read_key(j, key, w, b) && b) fail("{}: {}: biases are not implemented (expected false)", origin, key);
  }
  // eos_token_id (an import keeps the model's: where generate stops): an id or a list of ids.
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    for (const json& id : e.is_array() ? e : json::array({e}))
      KVS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < m.vocab_size,
                "{}: eos_token_id: {} is not a token id of vocab_size {}", origin, id.dump(), m.vocab_size);
  }
  int hd = 0;
  if (read_key(j, "head_dim", w, hd) && hd != m.head_dim())
    fail("{}: head_dim: {} differs from hidden_size / num_attention_heads = {}", origin, hd, m.head_dim());
  return m;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = read_config(path, overrides);
  validate(c, path);
  return c;
}

Config read_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("{}: cannot read: is a directory", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot read: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("{}: cannot read: {}", path, std::strerror(errno));
  json j = parse_text(ss.str(), path);
  for (const auto& o : overrides) apply_override(j, o, path);
  Config c = config_from_json(j, path);
  c.source_path = path;
  return c;
}

std::string describe_kv_shift(const KvShiftConfig& k) {
  if (!k.enabled) return "off";
  std::string which;
  if (k.shift_q) which += "Q+";
  if (k.shift_k) which += "K+";
  if (k.shift_v) which += "V+";
  if (!which.empty()) which.pop_back();
  return fmt::format("on ({}, window {}, {})", which.empty() ? "nothing shifted" : which, k.window,
                     k.parametrization);
}

}  // namespace kvs
