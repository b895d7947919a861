#include "hf/hf_config.h"

#include <cstdint>
#include <set>
#include <type_traits>

#include "core/error.h"
#include "hf/rope_keys.h"

namespace kvs::hf {

using nlohmann::json;

bool needs_remote_code(const ModelConfig& m) {
  const auto& k = m.kv_shift;
  const bool shifted = k.enabled && (k.shift_k || k.shift_v || k.shift_q);
  return shifted || m.position_encoding != PositionEncoding::Rope;
}

namespace {

json id_or_null(int id) { return id >= 0 ? json(id) : json(nullptr); }

}  // namespace

json export_config(const ModelConfig& m, const std::string& torch_dtype, const SpecialIds& ids) {
  json j = model_to_hf_json(m);  // LlamaConfig keys (+ kv_shift, position_encoding)
  // Packed-document masking is a training option: inference inputs are one document.
  j.erase("document_boundaries");
  j["torch_dtype"] = torch_dtype;
  j["bos_token_id"] = id_or_null(ids.bos);
  j["eos_token_id"] = id_or_null(ids.eos);
  if (ids.pad >= 0) j["pad_token_id"] = ids.pad;
  write_rope_keys(m, j);
  j["pretraining_tp"] = 1;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  if (!needs_remote_code(m)) {
    j.erase("kv_shift");
    j.erase("position_encoding");
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["model_type"] = "llama";
    return j;
  }
  j["architectures"] = json::array({"KvShiftLlamaForCausalLM"});
  j["model_type"] = "kvshift_llama";
  j["auto_map"] = {{"AutoConfig", "configuration_kvshift_llama.KvShiftLlamaConfig"},
                   {"AutoModel", "modeling_kvshift_llama.KvShiftLlamaModel"},
                   {"AutoModelForCausalLM", "modeling_kvshift_llama.KvShiftLlamaForCausalLM"}};
  return j;
}

json generation_config(const SpecialIds& ids, int tokenizer_size, int vocab_size) {
  json j = {{"_from_model_config", true}};
  if (ids.bos >= 0) j["bos_token_id"] = ids.bos;
  if (ids.eos >= 0) j["eos_token_id"] = ids.eos;
  if (ids.pad >= 0) j["pad_token_id"] = ids.pad;
  if (tokenizer_size > 0 && tokenizer_size < vocab_size) {
    json none = json::array();
    for (int id = tokenizer_size; id < vocab_size; ++id) none.push_back(id);
    j["suppress_tokens"] = none;
  }
  return j;
}

namespace {

// An integer JSON value that fits an int (nlohmann's get<int> would wrap 2^32 + 8 to 8).
int int_value(const json& v, const char* key, const std::string& origin) {
  KVS_CHECK(v.is_number_integer(), "{}: {}: expected an integer, got {}", origin, key, v.dump());
  KVS_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX),
            "{}: {}: {} is out of range", origin, key, v.dump());
  const int64_t x = v.get<int64_t>();
  KVS_CHECK(x >= INT32_MIN && x <= INT32_MAX, "{}: {}: {} is out of range", origin, key, v.dump());
  return static_cast<int>(x);
}

// Typed access with a one-line error naming the file and key.
template <class T>
T get_or(const json& j, const char* key, T dflt, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if constexpr (std::is_same_v<T, int>) return int_value(*it, key, origin);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail("{}: {}: unexpected value {}", origin, key, it->dump());
  }
}

int required_int(const json& j, const char* key, const std::string& origin) {
  KVS_CHECK(j.contains(key) && j[key].is_number_integer(), "{}: missing or non-integer key '{}'", origin, key);
  return int_value(j[key], key, origin);
}

}  // namespace

ModelConfig import_config(const json& j, const std::string& origin) {
  KVS_CHECK(j.is_object(), "{}: expected a JSON object", origin);
  const std::string type = get_or<std::string>(j, "model_type", "llama", origin);
  KVS_CHECK(type == "llama" || type == "mistral" || type == "kvshift_llama",
            "{}: model_type \"{}\" is not a Llama-architecture model (llama, mistral or kvshift_llama)", origin, type);
  ModelConfig m;
  m.hidden_size = required_int(j, "hidden_size", origin);
  m.intermediate_size = required_int(j, "intermediate_size", origin);
  m.num_hidden_layers = required_int(j, "num_hidden_layers", origin);
  m.num_attention_heads = required_int(j, "num_attention_heads", origin);
  m.vocab_size = required_int(j, "vocab_size", origin);
  m.num_key_value_heads = get_or<int>(j, "num_key_value_heads", m.num_attention_heads, origin);
  // Defaults are LlamaConfig's / MistralConfig's, for configs that leave keys out.
  m.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, origin);
  read_rope_keys(j, origin, m);
  m.max_position_embeddings =
      get_or<int>(j, "max_position_embeddings", type == "mistral" ? 4096 * 32 : 2048, origin);
  m.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, origin);
  m.initializer_range = get_or<double>(j, "initializer_range", 0.02, origin);
  m.kv_shift.enabled = false;
  if (type == "kvshift_llama") {
    const std::string pe = get_or<std::string>(j, "position_encoding", "rope", origin);
    m.position_encoding = parse_enum<PositionEncoding>(pe, origin, "position_encoding");
    KVS_CHECK(!j.contains("kv_shift") || j["kv_shift"].is_object() || j["kv_shift"].is_null(),
              "{}: kv_shift: expected an object, got {}", origin, j["kv_shift"].dump());
    if (j.contains("kv_shift") && j["kv_shift"].is_object()) {
      const json& k = j["kv_shift"];
      const std::string o = origin + ": kv_shift";
      // A misspelt key would silently import another model (say shift_q off).
      static const std::set<std::string> kKeys = {"enabled", "window", "shift_k", "shift_v", "shift_q",
                                                  "parametrization"};
      for (const auto& [key, value] : k.items())
        KVS_CHECK(kKeys.count(key), "{}: kv_shift.{}: unknown key (known: enabled, window, shift_k, shift_v, shift_q, "
                  "parametrization)", origin, key);
      m.kv_shift.enabled = get_or<bool>(k, "enabled", true, o);
      m.kv_shift.window = get_or<int>(k, "window", 1, o);
      m.kv_shift.shift_k = get_or<bool>(k, "shift_k", true, o);
      m.kv_shift.shift_v = get_or<bool>(k, "shift_v", true, o);
      m.kv_shift.shift_q = get_or<bool>(k, "shift_q", false, o);
      const std::string par = get_or<std::string>(k, "parametrization", "free", o);
      m.kv_shift.parametrization = parse_enum<ShiftParametrization>(par, origin, "kv_shift.parametrization");
    }
  }

  // What the model would do differently from ours.
  const std::string act = get_or<std::string>(j, "hidden_act", "silu", origin);
  KVS_CHECK(act == "silu", "{}: hidden_act \"{}\" cannot be expressed (kvshift's MLP is SwiGLU with silu)", origin,
            act);
  for (const char* key : {"attention_bias", "mlp_bias"})
    KVS_CHECK(!get_or<bool>(j, key, false, origin), "{}: {} true cannot be expressed (kvshift has no biases)", origin,
              key);
  // Mistral attends within sliding_window: transformers' default 4096 when the
  // key is absent, everywhere when it is null. Its Llama ignores the key.
  const int window =
      type != "mistral" ? 0 : j.contains("sliding_window") ? get_or<int>(j, "sliding_window", 0, origin) : 4096;
  if (window > 0 && window < m.max_position_embeddings && get_or<bool>(j, "use_sliding_window", true, origin))
    fail("{}: sliding_window {} < max_position_embeddings {} cannot be expressed (kvshift attends to every "
         "position; set sliding_window to null, or max_position_embeddings to {}, if that is what you want)",
         origin, window, m.max_position_embeddings, window);
  const int head_dim = get_or<int>(j, "head_dim", 0, origin);
  KVS_CHECK(head_dim == 0 || m.num_attention_heads <= 0 || head_dim == m.hidden_size / m.num_attention_heads,
            "{}: head_dim {} != hidden_size / num_attention_heads = {} cannot be expressed", origin, head_dim,
            m.num_attention_heads > 0 ? m.hidden_size / m.num_attention_heads : 0);
  // The rest of the checks (positive sizes, divisibility, window range, ...): ours.
  return model_from_hf_json(model_to_hf_json(m), origin);
}

}  // namespace kvs::hf
