// Experiment configuration: strict JSON parsing, overrides, validation and
// serialisation. See docs/CONFIG.md for every key.
//
// Conventions of the messages (all one line, all thrown as kvs::Error):
//   "<origin>: unknown key 'train.lerning_rate' (did you mean 'train.learning_rate'?)"
//   "<origin>: train.lr: expected a number, got string \"abc\""
//   "<origin>: missing required key 'model.hidden_size'"
//   "<origin>: model.hidden_size: must be positive, got 0"
// where <origin> is the file name (or whatever the caller passed).
#include "model/config.h"

#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace kvs {

using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------
// Schema: the keys every object of the config file may hold. Single source of
// truth for the unknown-key check, the suggestions and the override walker.
// ---------------------------------------------------------------------------

struct Section {
  const char* path;                 // "" = top level
  std::vector<std::string> keys;
};

const std::vector<Section>& schema() {
  static const std::vector<Section> s = {
      {"", {"name", "device", "model", "train", "data", "parallel"}},
      {"model",
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "rms_norm_eps", "rope_theta", "position_encoding", "vocab_size", "max_position_embeddings",
        "tie_word_embeddings", "initializer_range", "kv_shift", "document_boundaries", "bos_token_id"}},
      {"model.kv_shift", {"enabled", "window", "shift_k", "shift_v", "shift_q", "parametrization"}},
      {"train",
       {"seed", "steps", "micro_batch_size", "grad_accum_steps", "seq_len", "lr", "min_lr", "warmup_steps",
        "schedule", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "eval_every", "eval_sequences",
        "checkpoint_every", "log_every", "threads", "recompute", "attention_backend"}},
      {"data", {"type", "induction", "ngram", "hopk", "shards", "tokenizer"}},
      {"data.induction", {"token_lo", "token_hi", "pool_size", "max_repeats", "pad_token"}},
      {"data.ngram", {"token_lo", "token_hi", "num_pairs", "table_seed"}},
      {"data.hopk", {"token_lo", "token_hi", "k"}},
      {"data.shards", {"train", "val", "val_fraction"}},
      {"parallel", {"tp"}},
  };
  return s;
}

const Section* find_section(const std::string& path) {
  for (const auto& s : schema())
    if (path == s.path) return &s;
  return nullptr;
}

// Keys of a Hugging Face config.json that we accept beside the model keys.
const std::vector<std::string>& hf_extra_keys() {
  static const std::vector<std::string> k = {"architectures", "model_type", "head_dim",    "hidden_act",
                                             "attention_bias", "mlp_bias",  "torch_dtype"};
  return k;
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                          std::tolower(static_cast<unsigned char>(b[j - 1]))
                                      ? 0
                                      : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean 'x.y'?)" or "": the closest key of the same object when the
// edit distance is small, else the same key name in another section.
std::string suggestion(const std::string& key, const std::string& parent, const std::vector<std::string>& known) {
  const size_t limit = key.size() <= 4 ? 1 : key.size() <= 8 ? 2 : 3;
  size_t best = limit + 1;
  std::string best_key;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best) best = d, best_key = k;
  }
  if (!best_key.empty()) return " (did you mean '" + join(parent, best_key) + "'?)";
  for (const auto& s : schema())
    for (const auto& k : s.keys)
      if (k == key && parent != s.path) return " (did you mean '" + join(s.path, k) + "'?)";
  return "";
}

std::string truncated(std::string s, size_t n = 60) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean " + v.dump();
    case json::value_t::string: return "string " + truncated(v.dump());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number " + v.dump();
    case json::value_t::array: return "array " + truncated(v.dump());
    case json::value_t::object: return "object " + truncated(v.dump());
    default: return "a value of another kind";
  }
}

[[noreturn]] void type_error(const std::string& origin, const std::string& path, const char* expected,
                             const json& got) {
  fail("{}: {}: expected {}, got {}", origin, path, expected, describe(got));
}

void check_keys(const json& j, const std::string& origin, const std::string& path,
                const std::vector<std::string>& known, const std::vector<std::string>& also = {}) {
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    if (std::find(also.begin(), also.end(), k) != also.end()) continue;
    fail("{}: unknown key '{}'{}", origin, join(path, k), suggestion(k, path, known));
  }
}

// ---------------------------------------------------------------------------
// Typed readers.
// ---------------------------------------------------------------------------

int as_int(const json& v, const std::string& origin, const std::string& path) {
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT_MAX)) fail("{}: {}: {} does not fit in a 32-bit integer", origin, path, v.dump());
    return static_cast<int>(u);
  }
  if (v.is_number_integer()) {
    auto x = v.get<int64_t>();
    if (x < INT_MIN || x > INT_MAX) fail("{}: {}: {} does not fit in a 32-bit integer", origin, path, v.dump());
    return static_cast<int>(x);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) type_error(origin, path, "an integer", v);
    if (d < INT_MIN || d > INT_MAX) fail("{}: {}: {} does not fit in a 32-bit integer", origin, path, v.dump());
    return static_cast<int>(d);
  }
  type_error(origin, path, "an integer", v);
}

uint64_t as_u64(const json& v, const std::string& origin, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    auto x = v.get<int64_t>();
    if (x < 0) fail("{}: {}: expected a non-negative integer, got number {}", origin, path, x);
    return static_cast<uint64_t>(x);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) type_error(origin, path, "a non-negative integer", v);
    // Doubles are exact integers only up to 2^53; write bigger seeds as integers.
    if (d < 0 || d > 9007199254740992.0)
      fail("{}: {}: expected a non-negative integer, got number {}", origin, path, v.dump());
    return static_cast<uint64_t>(d);
  }
  type_error(origin, path, "a non-negative integer", v);
}

double as_double(const json& v, const std::string& origin, const std::string& path) {
  if (!v.is_number()) type_error(origin, path, "a number", v);
  double d = v.get<double>();
  if (!std::isfinite(d)) type_error(origin, path, "a finite number", v);
  return d;
}

bool as_bool(const json& v, const std::string& origin, const std::string& path) {
  if (!v.is_boolean()) type_error(origin, path, "a boolean (true or false)", v);
  return v.get<bool>();
}

std::string as_string(const json& v, const std::string& origin, const std::string& path) {
  if (!v.is_string()) type_error(origin, path, "a string", v);
  return v.get<std::string>();
}

std::vector<std::string> as_string_list(const json& v, const std::string& origin, const std::string& path) {
  if (!v.is_array()) type_error(origin, path, "an array of strings", v);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_string(v[i], origin, fmt::format("{}[{}]", path, i)));
  return out;
}

void require_object(const json& v, const std::string& origin, const std::string& path) {
  if (v.is_object()) return;
  if (path.empty()) fail("{}: expected a JSON object at the top level, got {}", origin, describe(v));
  type_error(origin, path, "an object", v);
}

// One JSON object being read: typed getters that leave the default in place
// when the key is absent.
class Obj {
 public:
  Obj(const json& j, std::string origin, std::string path) : j_(j), origin_(std::move(origin)), path_(std::move(path)) {
    require_object(j_, origin_, path_);
  }
  bool has(const char* key) const { return j_.contains(key); }
  std::string at(const char* key) const { return join(path_, key); }
  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void require(const char* key) const {
    if (!has(key)) fail("{}: missing required key '{}'", origin_, at(key));
  }
  void get(const char* key, int& out) const {
    if (auto* v = find(key)) out = as_int(*v, origin_, at(key));
  }
  void get(const char* key, uint64_t& out) const {
    if (auto* v = find(key)) out = as_u64(*v, origin_, at(key));
  }
  void get(const char* key, double& out) const {
    if (auto* v = find(key)) out = as_double(*v, origin_, at(key));
  }
  void get(const char* key, bool& out) const {
    if (auto* v = find(key)) out = as_bool(*v, origin_, at(key));
  }
  void get(const char* key, std::string& out) const {
    if (auto* v = find(key)) out = as_string(*v, origin_, at(key));
  }
  void get(const char* key, std::vector<std::string>& out) const {
    if (auto* v = find(key)) out = as_string_list(*v, origin_, at(key));
  }
  const json& raw() const { return j_; }
  const std::string& origin() const { return origin_; }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string origin_, path_;
};

KvShiftConfig parse_kv_shift(const json& j, const std::string& origin, const std::string& path) {
  Obj o(j, origin, path);
  check_keys(j, origin, path, find_section("model.kv_shift")->keys);
  KvShiftConfig k;
  o.get("enabled", k.enabled);
  o.get("window", k.window);
  o.get("shift_k", k.shift_k);
  o.get("shift_v", k.shift_v);
  o.get("shift_q", k.shift_q);                  // absent (older checkpoints): false
  o.get("parametrization", k.parametrization);  // absent (older checkpoints): "free"
  return k;
}

// The model keys, shared by the config file's `model` section (path "model")
// and a Hugging Face config.json (path "", hf = true).
ModelConfig parse_model(const Obj& o, bool hf) {
  ModelConfig m;
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                        "max_position_embeddings"})
    o.require(k);
  o.get("hidden_size", m.hidden_size);
  o.get("intermediate_size", m.intermediate_size);
  o.get("num_hidden_layers", m.num_hidden_layers);
  o.get("num_attention_heads", m.num_attention_heads);
  m.num_key_value_heads = m.num_attention_heads;
  o.get("num_key_value_heads", m.num_key_value_heads);
  o.get("rms_norm_eps", m.rms_norm_eps);
  o.get("rope_theta", m.rope_theta);
  o.get("position_encoding", m.position_encoding);  // absent (older checkpoints): "rope"
  o.get("vocab_size", m.vocab_size);
  o.get("max_position_embeddings", m.max_position_embeddings);
  o.get("tie_word_embeddings", m.tie_word_embeddings);
  o.get("initializer_range", m.initializer_range);
  o.get("document_boundaries", m.document_boundaries);  // absent (older checkpoints): "none"
  o.get("bos_token_id", m.bos_token_id);
  if (auto* v = o.find("kv_shift")) {
    m.kv_shift = parse_kv_shift(*v, o.origin(), o.at("kv_shift"));
  } else if (hf) {
    m.kv_shift.enabled = false;  // a plain Llama config.json
  }
  return m;
}

void validate_model(const ModelConfig& m, const std::string& origin, const std::string& p) {
  auto positive = [&](const char* key, int v) {
    if (v <= 0) fail("{}: {}{}: must be positive, got {}", origin, p, key, v);
  };
  positive("hidden_size", m.hidden_size);
  positive("intermediate_size", m.intermediate_size);
  positive("num_hidden_layers", m.num_hidden_layers);
  positive("num_attention_heads", m.num_attention_heads);
  positive("num_key_value_heads", m.num_key_value_heads);
  positive("vocab_size", m.vocab_size);
  positive("max_position_embeddings", m.max_position_embeddings);
  if (m.hidden_size % m.num_attention_heads != 0)
    fail("{}: {}hidden_size: {} is not divisible by {}num_attention_heads ({})", origin, p, m.hidden_size, p,
         m.num_attention_heads);
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    fail("{}: {}num_key_value_heads: {}num_attention_heads ({}) is not divisible by {}", origin, p, p,
         m.num_attention_heads, m.num_key_value_heads);
  if (m.head_dim() % 2 != 0)
    fail("{}: {}hidden_size: head_dim = hidden_size / num_attention_heads = {} must be even (RoPE rotates pairs)",
         origin, p, m.head_dim());
  if (!(m.rms_norm_eps > 0)) fail("{}: {}rms_norm_eps: must be > 0, got {}", origin, p, m.rms_norm_eps);
  if (!(m.rope_theta > 0)) fail("{}: {}rope_theta: must be > 0, got {}", origin, p, m.rope_theta);
  if (m.position_encoding != "rope" && m.position_encoding != "none")
    fail("{}: {}position_encoding: must be \"rope\" or \"none\", got \"{}\"", origin, p, m.position_encoding);
  if (!(m.initializer_range > 0))
    fail("{}: {}initializer_range: must be > 0, got {}", origin, p, m.initializer_range);
  const std::string& db = m.document_boundaries;
  if (db != "none" && db != "shift" && db != "shift_and_attention")
    fail("{}: {}document_boundaries: must be \"none\", \"shift\" or \"shift_and_attention\", got \"{}\"", origin, p,
         db);
  if (m.bos_token_id < -1 || m.bos_token_id >= m.vocab_size)
    fail("{}: {}bos_token_id: must be -1 (none) or a token id in [0, vocab_size={}), got {}", origin, p, m.vocab_size,
         m.bos_token_id);
  if (db != "none" && m.bos_token_id < 0)
    fail("{}: {}document_boundaries: \"{}\" needs {}bos_token_id (the token that starts a document)", origin, p, db,
         p);
  if (m.kv_shift.window < 1 || m.kv_shift.window > 8)
    fail("{}: {}kv_shift.window: must be in [1, 8], got {}", origin, p, m.kv_shift.window);
  const std::string& par = m.kv_shift.parametrization;
  if (par != "free" && par != "sigmoid_gate" && par != "clamp01")
    fail("{}: {}kv_shift.parametrization: must be \"free\", \"sigmoid_gate\" or \"clamp01\", got \"{}\"", origin, p,
         par);
  if (par == "sigmoid_gate" && m.kv_shift.window != 1)
    fail("{}: {}kv_shift.parametrization: \"sigmoid_gate\" needs kv_shift.window 1 (one gate per head), got window {}",
         origin, p, m.kv_shift.window);
}

json kv_shift_to_json(const KvShiftConfig& k) {
  return json{{"enabled", k.enabled},           {"window", k.window},   {"shift_k", k.shift_k},
              {"shift_v", k.shift_v},           {"shift_q", k.shift_q}, {"parametrization", k.parametrization}};
}

json model_keys_to_json(const ModelConfig& m) {
  json j{{"hidden_size", m.hidden_size},
         {"intermediate_size", m.intermediate_size},
         {"num_hidden_layers", m.num_hidden_layers},
         {"num_attention_heads", m.num_attention_heads},
         {"num_key_value_heads", m.num_key_value_heads},
         {"rms_norm_eps", m.rms_norm_eps},
         {"rope_theta", m.rope_theta},
         {"position_encoding", m.position_encoding},
         {"vocab_size", m.vocab_size},
         {"max_position_embeddings", m.max_position_embeddings},
         {"tie_word_embeddings", m.tie_word_embeddings},
         {"initializer_range", m.initializer_range},
         {"kv_shift", kv_shift_to_json(m.kv_shift)}};
  // Written only when set, so configs and checkpoints that predate them read the same.
  if (m.document_boundaries != "none") j["document_boundaries"] = m.document_boundaries;
  if (m.bos_token_id >= 0) j["bos_token_id"] = m.bos_token_id;
  return j;
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
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API.
// ---------------------------------------------------------------------------

Config config_from_json(const json& j, const std::string& origin) {
  Obj top(j, origin, "");
  check_keys(j, origin, "", find_section("")->keys);
  Config c;
  top.get("name", c.name);
  top.get("device", c.device);

  top.require("model");
  {
    Obj o(j.at("model"), origin, "model");
    check_keys(o.raw(), origin, "model", find_section("model")->keys);
    c.model = parse_model(o, /*hf=*/false);
  }
  if (auto* v = top.find("train")) {
    Obj o(*v, origin, "train");
    check_keys(*v, origin, "train", find_section("train")->keys);
    TrainConfig& t = c.train;
    o.get("seed", t.seed);
    o.get("steps", t.steps);
    o.get("micro_batch_size", t.micro_batch_size);
    o.get("grad_accum_steps", t.grad_accum_steps);
    o.get("seq_len", t.seq_len);
    o.get("lr", t.lr);
    o.get("min_lr", t.min_lr);
    o.get("warmup_steps", t.warmup_steps);
    o.get("schedule", t.schedule);
    o.get("beta1", t.beta1);
    o.get("beta2", t.beta2);
    o.get("eps", t.eps);
    o.get("weight_decay", t.weight_decay);
    o.get("grad_clip", t.grad_clip);
    o.get("eval_every", t.eval_every);
    o.get("eval_sequences", t.eval_sequences);
    o.get("checkpoint_every", t.checkpoint_every);
    o.get("log_every", t.log_every);
    o.get("threads", t.threads);
    o.get("recompute", t.recompute);
    o.get("attention_backend", t.attention_backend);
  }
  if (auto* v = top.find("data")) {
    Obj o(*v, origin, "data");
    check_keys(*v, origin, "data", find_section("data")->keys);
    o.get("type", c.data.type);
    o.get("tokenizer", c.data.tokenizer);
    if (auto* iv = o.find("induction")) {
      Obj io(*iv, origin, "data.induction");
      check_keys(*iv, origin, "data.induction", find_section("data.induction")->keys);
      auto& d = c.data.induction;
      io.get("token_lo", d.token_lo);
      io.get("token_hi", d.token_hi);
      io.get("pool_size", d.pool_size);
      io.get("max_repeats", d.max_repeats);
      io.get("pad_token", d.pad_token);
    }
    if (auto* nv = o.find("ngram")) {
      Obj no(*nv, origin, "data.ngram");
      check_keys(*nv, origin, "data.ngram", find_section("data.ngram")->keys);
      auto& d = c.data.ngram;
      no.get("token_lo", d.token_lo);
      no.get("token_hi", d.token_hi);
      no.get("num_pairs", d.num_pairs);
      no.get("table_seed", d.table_seed);
    }
    if (auto* hv = o.find("hopk")) {
      Obj ho(*hv, origin, "data.hopk");
      check_keys(*hv, origin, "data.hopk", find_section("data.hopk")->keys);
      auto& d = c.data.hopk;
      ho.get("token_lo", d.token_lo);
      ho.get("token_hi", d.token_hi);
      ho.get("k", d.k);
    }
    if (auto* sv = o.find("shards")) {
      Obj so(*sv, origin, "data.shards");
      check_keys(*sv, origin, "data.shards", find_section("data.shards")->keys);
      auto& d = c.data.shards;
      so.get("train", d.train);
      so.get("val", d.val);
      so.get("val_fraction", d.val_fraction);
    }
  }
  if (auto* v = top.find("parallel")) {
    Obj o(*v, origin, "parallel");
    check_keys(*v, origin, "parallel", find_section("parallel")->keys);
    o.get("tp", c.parallel.tp);
  }
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
      if (find_section(sofar) == nullptr) {
        const Section* ps = find_section(parent);
        fail("{}: override '{}': unknown key '{}'{}", origin, assignment, sofar,
             ps ? suggestion(parts[i], parent, ps->keys) : std::string());
      }
      (*cur)[parts[i]] = json::object();  // a known section the file leaves out
    }
    cur = &(*cur)[parts[i]];
    if (!cur->is_object())
      fail("{}: override '{}': '{}' is {}, not an object", origin, assignment, sofar, describe(*cur));
  }
  // The last key: when its parent is a known section, check it here so the
  // message names the override rather than the file.
  if (const Section* ps = find_section(sofar)) {
    const auto& k = parts.back();
    if (std::find(ps->keys.begin(), ps->keys.end(), k) == ps->keys.end())
      fail("{}: override '{}': unknown key '{}'{}", origin, assignment, path, suggestion(k, sofar, ps->keys));
  }
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // not JSON: take it as a string (e.g. device=cuda)
  (*cur)[parts.back()] = std::move(value);
}

void validate(const Config& c, const std::string& origin) {
  if (c.device != "cpu" && c.device != "cuda")
    fail("{}: device: must be \"cpu\" or \"cuda\", got \"{}\"", origin, c.device);

  const ModelConfig& m = c.model;
  validate_model(m, origin, "model.");
  // Kernels and checkpoints handle windows up to 8 (validate_model); training
  // is limited to the windows the paper ran (1, and 2 and 3 in section 4.7).
  if (m.kv_shift.window > 3)
    fail("{}: model.kv_shift.window: training supports windows 1 to 3 (the paper's), got {}", origin,
         m.kv_shift.window);
  if (c.device == "cuda" && m.document_boundaries != "none")
    fail("{}: model.document_boundaries: \"{}\" needs device \"cpu\" for now (the CUDA kernels have no document "
         "masks yet)",
         origin, m.document_boundaries);
  if (c.device == "cuda") {
    const int d = m.head_dim();
    if (d != 16 && d != 32 && d != 64 && d != 128)
      fail("{}: device: \"cuda\" needs head_dim (hidden_size / num_attention_heads) of 16, 32, 64 or 128, got {}",
           origin, d);
  }

  const TrainConfig& t = c.train;
  auto at_least = [&](const char* key, long long v, long long lo) {
    if (v < lo) fail("{}: train.{}: must be >= {}, got {}", origin, key, lo, v);
  };
  at_least("seq_len", t.seq_len, 1);
  if (t.seq_len > m.max_position_embeddings)
    fail("{}: train.seq_len: {} exceeds model.max_position_embeddings ({})", origin, t.seq_len,
         m.max_position_embeddings);
  at_least("micro_batch_size", t.micro_batch_size, 1);
  at_least("grad_accum_steps", t.grad_accum_steps, 1);
  at_least("steps", t.steps, 1);
  if (!(t.lr > 0)) fail("{}: train.lr: must be > 0, got {}", origin, t.lr);
  if (!(t.min_lr >= 0 && t.min_lr <= t.lr))
    fail("{}: train.min_lr: must be in [0, train.lr = {}], got {}", origin, t.lr, t.min_lr);
  at_least("warmup_steps", t.warmup_steps, 0);
  if (t.schedule != "constant" && t.schedule != "cosine")
    fail("{}: train.schedule: must be \"constant\" or \"cosine\", got \"{}\"", origin, t.schedule);
  if (!(t.beta1 >= 0 && t.beta1 < 1)) fail("{}: train.beta1: must be in [0, 1), got {}", origin, t.beta1);
  if (!(t.beta2 >= 0 && t.beta2 < 1)) fail("{}: train.beta2: must be in [0, 1), got {}", origin, t.beta2);
  if (!(t.eps > 0)) fail("{}: train.eps: must be > 0, got {}", origin, t.eps);
  if (!(t.weight_decay >= 0)) fail("{}: train.weight_decay: must be >= 0, got {}", origin, t.weight_decay);
  if (!(t.grad_clip >= 0)) fail("{}: train.grad_clip: must be >= 0 (0 disables clipping), got {}", origin, t.grad_clip);
  at_least("eval_every", t.eval_every, 0);
  at_least("eval_sequences", t.eval_sequences, 1);
  at_least("checkpoint_every", t.checkpoint_every, 0);
  at_least("log_every", t.log_every, 1);
  at_least("threads", t.threads, 0);
  if (t.recompute != "none" && t.recompute != "attention" && t.recompute != "full")
    fail("{}: train.recompute: must be \"none\", \"attention\" or \"full\", got \"{}\"", origin, t.recompute);
  if (t.attention_backend != "flash" && t.attention_backend != "cudnn")
    fail("{}: train.attention_backend: must be \"flash\" or \"cudnn\", got \"{}\"", origin, t.attention_backend);
  if (t.attention_backend == "cudnn" && c.device != "cuda")
    fail("{}: train.attention_backend: \"cudnn\" needs device \"cuda\" (device is \"{}\")", origin, c.device);

  const DataConfig& d = c.data;
  if (d.type == "induction") {
    const auto& in = d.induction;
    if (in.token_lo < 0) fail("{}: data.induction.token_lo: must be >= 0, got {}", origin, in.token_lo);
    if (in.token_hi <= in.token_lo)
      fail("{}: data.induction.token_hi: must be > data.induction.token_lo ({}), got {}", origin, in.token_lo,
           in.token_hi);
    if (in.token_hi > m.vocab_size)
      fail("{}: data.induction.token_hi: {} exceeds model.vocab_size ({})", origin, in.token_hi, m.vocab_size);
    const int range = in.token_hi - in.token_lo;
    if (in.pool_size < 2 || in.pool_size > range)
      fail("{}: data.induction.pool_size: must be in [2, token_hi - token_lo = {}], got {}", origin, range,
           in.pool_size);
    if (in.max_repeats < 0) fail("{}: data.induction.max_repeats: must be >= 0, got {}", origin, in.max_repeats);
    if (in.pad_token < 0 || in.pad_token >= m.vocab_size)
      fail("{}: data.induction.pad_token: must be in [0, model.vocab_size = {}), got {}", origin, m.vocab_size,
           in.pad_token);
    if (in.pad_token >= in.token_lo && in.pad_token < in.token_hi)
      fail("{}: data.induction.pad_token: {} lies inside the sequence tokens [token_lo, token_hi) = [{}, {})", origin,
           in.pad_token, in.token_lo, in.token_hi);
  } else if (d.type == "ngram") {
    const auto& n = d.ngram;
    if (n.token_lo < 0) fail("{}: data.ngram.token_lo: must be >= 0, got {}", origin, n.token_lo);
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
  } else if (d.type == "hopk") {
    const auto& h = d.hopk;
    if (h.token_lo < 0) fail("{}: data.hopk.token_lo: must be >= 0, got {}", origin, h.token_lo);
    if (h.token_hi - h.token_lo < 2)
      fail("{}: data.hopk.token_hi: the alphabet [token_lo, token_hi) needs >= 2 tokens, got [{}, {})", origin,
           h.token_lo, h.token_hi);
    if (h.token_hi > m.vocab_size)
      fail("{}: data.hopk.token_hi: {} exceeds model.vocab_size ({})", origin, h.token_hi, m.vocab_size);
    if (h.k < 1 || h.k > t.seq_len - 2)
      fail("{}: data.hopk.k: must be in [1, train.seq_len - 2 = {}], got {}", origin, t.seq_len - 2, h.k);
  } else if (d.type == "shards") {
    const auto& s = d.shards;
    if (s.train.empty()) fail("{}: data.shards.train: must list at least one shard file or glob", origin);
    for (size_t i = 0; i < s.train.size(); ++i)
      if (s.train[i].empty()) fail("{}: data.shards.train[{}]: empty path", origin, i);
    for (size_t i = 0; i < s.val.size(); ++i)
      if (s.val[i].empty()) fail("{}: data.shards.val[{}]: empty path", origin, i);
    if (!(s.val_fraction >= 0 && s.val_fraction < 1))
      fail("{}: data.shards.val_fraction: must be in [0, 1), got {}", origin, s.val_fraction);
  } else {
    fail("{}: data.type: must be \"induction\", \"ngram\", \"hopk\" or \"shards\", got \"{}\"", origin, d.type);
  }

  check_tensor_parallel(c.model, c.parallel.tp, origin);
}

json to_json(const Config& c) {
  const TrainConfig& t = c.train;
  const DataConfig& d = c.data;
  json j = json{
      {"name", c.name},
      {"device", c.device},
      {"model", model_keys_to_json(c.model)},
      {"train",
       {{"seed", t.seed},
        {"steps", t.steps},
        {"micro_batch_size", t.micro_batch_size},
        {"grad_accum_steps", t.grad_accum_steps},
        {"seq_len", t.seq_len},
        {"lr", t.lr},
        {"min_lr", t.min_lr},
        {"warmup_steps", t.warmup_steps},
        {"schedule", t.schedule},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"eps", t.eps},
        {"weight_decay", t.weight_decay},
        {"grad_clip", t.grad_clip},
        {"eval_every", t.eval_every},
        {"eval_sequences", t.eval_sequences},
        {"checkpoint_every", t.checkpoint_every},
        {"log_every", t.log_every},
        {"threads", t.threads},
        {"recompute", t.recompute},
        {"attention_backend", t.attention_backend}}},
      {"data",
       {{"type", d.type},
        {"induction",
         {{"token_lo", d.induction.token_lo},
          {"token_hi", d.induction.token_hi},
          {"pool_size", d.induction.pool_size},
          {"max_repeats", d.induction.max_repeats},
          {"pad_token", d.induction.pad_token}}},
        {"ngram",
         {{"token_lo", d.ngram.token_lo},
          {"token_hi", d.ngram.token_hi},
          {"num_pairs", d.ngram.num_pairs},
          {"table_seed", d.ngram.table_seed}}},
        {"hopk", {{"token_lo", d.hopk.token_lo}, {"token_hi", d.hopk.token_hi}, {"k", d.hopk.k}}},
        {"shards", {{"train", d.shards.train}, {"val", d.shards.val}, {"val_fraction", d.shards.val_fraction}}}}},
      {"parallel", {{"tp", c.parallel.tp}}},
  };
  // Absent = none, so configs without a tokenizer (toy tasks, byte corpus) round-trip unchanged.
  if (!d.tokenizer.empty()) j["data"]["tokenizer"] = d.tokenizer;
  return j;
}

json model_to_hf_json(const ModelConfig& m) {
  json j = model_keys_to_json(m);
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
  Obj o(j, origin, "");
  check_keys(j, origin, "", find_section("model")->keys, hf_extra_keys());
  ModelConfig m = parse_model(o, /*hf=*/true);
  validate_model(m, origin, "");

  // The HF-only keys: tolerated, and checked where a value would mean a model we do not implement.
  std::vector<std::string> archs;
  o.get("architectures", archs);
  std::string s;
  if (o.has("model_type")) {
    o.get("model_type", s);
    if (s != "llama") fail("{}: model_type: expected \"llama\", got \"{}\"", origin, s);
  }
  if (o.has("hidden_act")) {
    o.get("hidden_act", s);
    if (s != "silu") fail("{}: hidden_act: only \"silu\" is implemented, got \"{}\"", origin, s);
  }
  if (o.has("torch_dtype")) o.get("torch_dtype", s);
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool b = false;
    o.get(key, b);
    if (b) fail("{}: {}: biases are not implemented (expected false)", origin, key);
  }
  if (o.has("head_dim")) {
    int hd = 0;
    o.get("head_dim", hd);
    if (hd != m.head_dim())
      fail("{}: head_dim: {} differs from hidden_size / num_attention_heads = {}", origin, hd, m.head_dim());
  }
  return m;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
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
  validate(c, path);
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
